"""Flower's simulation engine (Ray) running the project's own apps, ``server.app:app`` and
``client_runtime.app:app``, with one SuperNode per data partition.

Flower's own simulation runtime (the one ``flwr run`` starts) hands the run configuration to the
apps through the ServerApp's context; this does the same, so the apps behave here exactly as they
do under ``flwr run``. Clients are created per message and dropped after it; what a Ray actor keeps
between messages is bounded (one data set, one device, two compiled steps), so memory does not
grow with the number of clients. ``ray_address`` joins an existing Ray cluster instead of starting
one (Flower passes ``init_args`` to ``ray.init``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

from mgfl.run_config import RunConfig

SERVER_APP = "server.app:app"
CLIENT_APP = "client_runtime.app:app"


def load_component(reference: str):
    """``"module:attribute"`` -> the object, the way Flower resolves pyproject components."""
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def supernode_count(config: RunConfig) -> int:
    """One node per client: the natural groups of the data set, or ``num-clients``."""
    if config.partition == "natural":
        import numpy as np

        from mgfl.data.registry import load_dataset

        groups = len(np.unique(load_dataset(config.dataset).groups_train))
        if config.num_clients not in (0, groups):
            raise ValueError(f"the natural partition of {config.dataset} has {groups} clients; "
                             "leave num-clients at 0 or choose iid/dirichlet")
        return groups
    if config.num_clients < 1:
        raise ValueError(f"the {config.partition} partition needs num-clients >= 1")
    return config.num_clients


def backend_config(client_cpus: float, client_gpus: float, ray_address: str | None) -> dict:
    init_args: dict = {"address": ray_address} if ray_address else {}
    return {"client_resources": {"num_cpus": client_cpus, "num_gpus": client_gpus},
            "init_args": init_args}


def run_simulation(config: RunConfig, *, client_cpus: float = 1.0, client_gpus: float = 0.0,
                   ray_address: str | None = None, verbose: bool = False) -> dict:
    """Runs the federation ``config`` describes; returns the run's history (as in
    ``<output-dir>/history.json``)."""
    from flwr.app import Context, RecordDict
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    if not config.output_dir:
        raise ValueError("the simulation needs an output-dir for its history and checkpoints")
    nodes = supernode_count(config)
    # Ray hides GPUs from actors given num_gpus 0, which would hide them from OpenCL too.
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                      run_config=config.to_mapping())
    history_path = Path(config.output_dir) / "history.json"
    history_path.unlink(missing_ok=True)
    _run_simulation(
        num_supernodes=nodes,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        client_app=load_component(CLIENT_APP),
        server_app=load_component(SERVER_APP),
        backend_config=backend_config(client_cpus, client_gpus, ray_address),
        server_app_context=context,
        verbose_logging=verbose,
    )
    if not history_path.exists():
        raise RuntimeError(f"the simulation ended without writing {history_path}")
    return json.loads(history_path.read_text())
