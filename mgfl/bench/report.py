"""Benchmark rows, their timing rules, the table on screen and the JSON file.

Every row compares one case measured by mgfl (``ours_s``) with a reference library
(``reference_s``) in the same process on the same inputs; ``ratio`` is ``reference_s / ours_s``:
above 1 mgfl is faster, 0.8 means mgfl reaches 80% of the reference's speed.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class BenchRow:
    suite: str
    case: str
    ours_s: float
    reference: str
    reference_s: float | None
    ratio: float | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ratio is None and self.reference_s and self.ours_s > 0:
            self.ratio = self.reference_s / self.ours_s

    def to_json(self) -> dict:
        row = asdict(self)
        extra = row.pop("extra")
        return {**row, **extra}


def median_wall_seconds(run: Callable[[], None], repeats: int, warmup: int = 1) -> float:
    """Median wall-clock time of ``run()`` (which must wait for its own work), warm-up excluded."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_json(rows: list[BenchRow], path: Path, meta: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": [r.to_json() for r in rows]}, indent=2))


def print_table(rows: list[BenchRow], title: str, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("suite", "case", "ours", "reference", "reference time", "ratio", "notes"):
        table.add_column(column)
    for r in rows:
        notes = ", ".join(f"{k}={_fmt(v)}" for k, v in r.extra.items())
        table.add_row(r.suite, r.case, _ms(r.ours_s), r.reference, _ms(r.reference_s),
                      f"{r.ratio:.2f}" if r.ratio else "-", notes)
    (console or Console()).print(table)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds else "-"


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
