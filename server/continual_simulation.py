"""Federated class-incremental learning in simulation.

``simulate`` runs the clients' rounds in this process, each client with its own Flower
``Context`` whose state (the exemplar memory) persists across rounds, as Flower keeps
``Context.state`` per node within a run; ``simulate_with_flower`` runs the same client and
server code as Flower apps on Flower's simulation engine (Ray). Either way the server evaluates
the global model on the held-out samples of every task after each round."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from flwr.app import Context, RecordDict

from mgfl import continual_federation as cf
from mgfl import continual_metrics

Progress = Callable[[int, list[float]], None]


def client_shares(config: cf.FederatedIncrementalConfig, labels, groups) -> list[np.ndarray]:
    """Each client's sample indices: an IID split of the training set."""
    from mgfl.data.partition import partition

    return partition(
        labels, groups, scheme="iid", num_clients=config.num_clients, seed=config.partition_seed
    )


def base_model(config: cf.FederatedIncrementalConfig, dataset):
    """The zoo model with the first task's head; returns it and its head's path."""
    from client_runtime.continual.head import head_path
    from mgfl.models.zoo import build_model

    model = build_model(
        config.model, input_shape=dataset.input_shape, num_classes=config.classes_per_task
    )
    return model, head_path(model)


def evaluator(config, device, dataset, progress: Progress | None = None):
    """Accuracy of a global state on the held-out samples of each task its head covers."""
    from client_runtime.continual.head import with_classes
    from client_runtime.continual.learner import eval_step

    base, head = base_model(config, dataset)
    tasks = config.task_labels()

    def evaluate(state: dict, server_round: int) -> dict:
        classes = state[f"{head}.weight"].shape[0]
        seen = [t for t in tasks if max(t) < classes]
        mask = np.isin(dataset.y_test, sum(seen, []))
        x, y = dataset.x_test[mask], dataset.y_test[mask]
        step = eval_step(device, with_classes(base, classes), state, config.eval_batch)
        predicted = step.predict(x).argmax(axis=1)
        per_task = [float(np.mean(predicted[np.isin(y, t)] == y[np.isin(y, t)])) for t in seen]
        if progress:
            progress(server_round, per_task)
        return {"accuracy_per_task": per_task, "accuracy": float(np.mean(predicted == y))}

    return evaluate


def summarize_run(config: cf.FederatedIncrementalConfig, history: list[dict]) -> dict:
    """The accuracy matrix (row ``i``: after the last round of task ``i``, once every client
    has finished it) with its metrics, and the exemplar storage of the clients."""
    tasks = config.task_labels()
    rows = []
    for i in range(len(tasks)):
        end = min(config.num_rounds, (i + 1) * config.rounds_per_task + config.stagger)
        per_task = history[end - 1]["accuracy_per_task"][: i + 1]
        rows.append(per_task + [float("nan")] * (len(tasks) - len(per_task)))
    result = continual_metrics.summarize(rows)
    last = history[-1]["clients"]
    result.update(
        config=config.to_mapping(),
        history=history,
        exemplar_bytes=int(sum(c["exemplar-bytes"] for c in last)),
        exemplar_bytes_per_client=[int(c["exemplar-bytes"]) for c in last],
    )
    return result


def simulate(config: cf.FederatedIncrementalConfig, device, dataset=None,
             progress: Progress | None = None) -> dict:  # fmt: skip
    """Every round, in this process; returns the summary of :func:`summarize_run`."""
    from client_runtime.continual.federated import client_round
    from mgfl.data.registry import load_dataset
    from server.continual import run_rounds

    dataset = dataset or load_dataset(config.dataset)
    base, head = base_model(config, dataset)
    shares = client_shares(config, dataset.y_train, dataset.groups_train)
    contexts = [
        Context(run_id=0, node_id=k, node_config={"partition-id": k}, state=RecordDict(),
                run_config=config.to_mapping())
        for k in range(config.num_clients)
    ]  # fmt: skip

    def send(messages: list[RecordDict]) -> list[RecordDict]:
        return [
            client_round(message, contexts[k], device, base, dataset.x_train[shares[k]],
                         dataset.y_train[shares[k]], config, k)
            for k, message in enumerate(messages)
        ]  # fmt: skip

    evaluate = evaluator(config, device, dataset, progress)
    _, history = run_rounds(config, base.init_state(config.seed), head, send, evaluate)
    return summarize_run(config, history)


def simulate_with_flower(config: cf.FederatedIncrementalConfig, verbose: bool = False) -> dict:
    """The run on Flower's simulation engine, one SuperNode per client, with the apps
    ``client_runtime.continual.app:app`` and ``server.continual_app:app``."""
    import logging
    import os

    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    from client_runtime.continual.app import app as client_app
    from server.continual_app import app as server_app

    if not config.output:
        raise ValueError("the Flower simulation needs an output file for its results")
    output = Path(config.output)
    output.unlink(missing_ok=True)
    # Ray hides GPUs from actors given num_gpus 0, which would hide them from OpenCL too.
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                      run_config=config.to_mapping())  # fmt: skip
    _run_simulation(  # as server.simulation does: the public call cannot pass a run config
        num_supernodes=config.num_clients,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        client_app=client_app,
        server_app=server_app,
        backend_config={"client_resources": {"num_cpus": 1.0, "num_gpus": 0.0}},
        server_app_context=context,
        verbose_logging=verbose,
    )
    if not output.exists():
        raise RuntimeError(f"the simulation ended without writing {output}")
    return json.loads(output.read_text())
