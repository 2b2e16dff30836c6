"""The server's state after every finished round, written so that a server killed at any moment
(SIGKILL included) can be started again and continue from the last finished round.

Two files in the output directory, each written to a temporary name and renamed into place
(``os.replace`` is atomic):

- ``server-state-NNN.npz``: the global model (``global/<name>``) and the wrapped Flower
  strategy's own arrays (``strategy/<attribute>/<key>``: FedAdam's moments, FedAvgM's momentum);
  plain arrays, read back with ``allow_pickle=False``.
- ``server-state.json``: the round, the name of that ``.npz``, the codecs, the strategy's
  attributes and the history so far. It is written last and is the commit point: until it names
  the new ``.npz``, a restart uses the previous round's.

The uplink codec's only state, the error-feedback residual, lives on the clients; the server's
downlink codecs (none, fp16) hold none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STATE_FILE = "server-state.json"
FORMAT = 1
STRATEGY_ATTRIBUTES = ("m_t", "v_t", "momentum_vector")  # Flower's FedOpt family and FedAvgM
# keys that may differ between the killed run and the resumed one
RESUMABLE_CHANGES = frozenset({"resume", "num-rounds", "device", "eval-batch"})


@dataclass
class ServerState:
    """What a restarted server needs to continue after ``round``."""

    round: int
    global_state: dict[str, np.ndarray]
    strategy_arrays: dict[str, dict[str, np.ndarray] | list[np.ndarray]] = field(
        default_factory=dict)
    config: dict = field(default_factory=dict)
    codecs: dict[str, str] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


def strategy_arrays_of(strategy: object) -> dict[str, dict[str, np.ndarray] | list[np.ndarray]]:
    """The array-valued state of a Flower strategy (empty for stateless ones)."""
    found: dict[str, dict[str, np.ndarray] | list[np.ndarray]] = {}
    for attribute in STRATEGY_ATTRIBUTES:
        value = getattr(strategy, attribute, None)
        if isinstance(value, Mapping):
            found[attribute] = {k: np.asarray(v) for k, v in value.items()}
        elif isinstance(value, (list, tuple)):
            found[attribute] = [np.asarray(v) for v in value]
    return found


def restore_strategy_arrays(strategy: object,
                            arrays: Mapping[str, dict[str, np.ndarray] | list[np.ndarray]]
                            ) -> None:
    for attribute, value in arrays.items():
        if attribute not in STRATEGY_ATTRIBUTES or not hasattr(strategy, attribute):
            raise ValueError(f"the saved state holds {attribute!r}, which "
                             f"{type(strategy).__name__} does not keep")
        setattr(strategy, attribute, value)


def _atomic_write(path: Path, write) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def save_state(directory: Path, state: ServerState) -> Path:
    """Writes ``state`` (arrays first, then the JSON that names them) and removes older arrays."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays_name = f"server-state-{state.round:03d}.npz"
    flat = {f"global/{name}": np.asarray(value) for name, value in state.global_state.items()}
    layout: dict[str, dict] = {}
    for attribute, value in state.strategy_arrays.items():
        if isinstance(value, Mapping):
            layout[attribute] = {"kind": "dict", "keys": list(value)}
            flat.update({f"strategy/{attribute}/{k}": np.asarray(v) for k, v in value.items()})
        else:
            layout[attribute] = {"kind": "list", "length": len(value)}
            flat.update({f"strategy/{attribute}/{i}": np.asarray(v) for i, v in enumerate(value)})
    _atomic_write(directory / arrays_name, lambda handle: np.savez(handle, **flat))
    document = {
        "format": FORMAT, "round": state.round, "arrays": arrays_name,
        "global": list(state.global_state), "strategy": layout, "config": state.config,
        "codecs": state.codecs, "history": state.history,
    }
    path = directory / STATE_FILE
    _atomic_write(path, lambda handle: handle.write(json.dumps(document, indent=1).encode()))
    for old in directory.glob("server-state-*.npz"):
        if old.name != arrays_name:
            old.unlink(missing_ok=True)
    return path


def load_state(directory: Path) -> ServerState | None:
    """The last committed state in ``directory``, or None when there is none."""
    path = Path(directory) / STATE_FILE
    if not path.exists():
        return None
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT:
        raise ValueError(f"{path}: state format {document.get('format')}, this mgfl reads "
                         f"{FORMAT}")
    with np.load(Path(directory) / document["arrays"], allow_pickle=False) as stored:
        global_state = {name: stored[f"global/{name}"] for name in document["global"]}
        strategy: dict[str, dict[str, np.ndarray] | list[np.ndarray]] = {}
        for attribute, spec in document["strategy"].items():
            if spec["kind"] == "dict":
                strategy[attribute] = {k: stored[f"strategy/{attribute}/{k}"]
                                       for k in spec["keys"]}
            else:
                strategy[attribute] = [stored[f"strategy/{attribute}/{i}"]
                                       for i in range(spec["length"])]
    return ServerState(document["round"], global_state, strategy, document["config"],
                       document["codecs"], document["history"])


def check_same_run(saved: Mapping[str, object], current: Mapping[str, object]) -> None:
    """A state may only be continued by the run that wrote it (same model, data, strategy...)."""
    differing = sorted(k for k in set(saved) | set(current)
                       if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k))
    if differing:
        raise ValueError(f"cannot resume: the saved run differs in {', '.join(differing)}; "
                         "use another output-dir or the same settings")
