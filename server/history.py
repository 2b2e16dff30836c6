"""What each round did, kept as a JSON file next to the checkpoints (``history.json``), rewritten
after every round so that a run cut short still leaves its figures."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from server.events import announce_round


@dataclass
class RoundRecord:
    """One round: the server's evaluation of the global model and the bytes it cost."""

    round: int
    accuracy: float
    loss: float
    uplink_bytes: int
    downlink_bytes: int
    clients: int = 0
    rejected: int = 0
    failed: int = 0
    seconds: float = 0.0
    checkpoint: str = ""
    client_metrics: dict[str, float] = field(default_factory=dict)
    rejections: list[dict] = field(default_factory=list)  # {"node": id, "reason": text}
    faults: dict[str, int] = field(default_factory=dict)  # injected in simulation, by kind
    aggregated: bool = True  # False: too few usable replies; the global model was kept
    note: str = ""
    statistics_replies: int = 0  # replies that carried BatchNorm statistics (statistics-every)
    # simulated fleet (devices set; None otherwise): clients that finished too late, this round's
    # simulated length, the run's simulated time so far, and each client's predicted seconds
    stragglers: int = 0
    straggler_nodes: list[int] = field(default_factory=list)
    round_s: float | None = None
    wall_clock_s: float | None = None
    client_times: list[dict] = field(default_factory=list)


def _finite(value):
    """JSON has no NaN: non-finite numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class RunHistory:
    """Rounds in order; round 0 is the initial model (no traffic)."""

    def __init__(self, path: Path | None, run: dict):
        self.path = Path(path) if path else None
        self.run = dict(run)
        self.rounds: list[RoundRecord] = []

    def add(self, record: RoundRecord) -> None:
        self.rounds.append(record)
        self.write()
        announce_round(_finite(asdict(record)))

    def to_dict(self) -> dict:
        trained = [r for r in self.rounds if r.round > 0]
        return _finite({
            "run": self.run,
            "rounds": [asdict(r) for r in self.rounds],
            "initial_accuracy": self.rounds[0].accuracy if self.rounds else None,
            "final_accuracy": self.rounds[-1].accuracy if self.rounds else None,
            "total_uplink_bytes": sum(r.uplink_bytes for r in trained),
            "total_downlink_bytes": sum(r.downlink_bytes for r in trained),
            "simulated_wall_clock_s": self.rounds[-1].wall_clock_s if self.rounds else None,
        })

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.to_dict(), indent=2))
        os.replace(partial, self.path)
