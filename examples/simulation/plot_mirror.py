"""Accuracy after the last round, seed by seed, of mirror runs (``torch_mirror.py`` JSON lines):
a table of each run's seeds and mean, and a plot with one line per run across seeds, so that a
difference between two codings can be told from the spread between seeds.

    python plot_mirror.py docs/mirror-seeds.png benchmarks/*/mirror.jsonl \\
        --runs "codec=none" "codec=stc:0.023" "codec=stc:0.038:3 statistics-every=5"

A run is named by its arguments without ``seed=`` and ``threads=``; where a seed of a run appears
in several files, the first row wins.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

SEED = re.compile(r"\s*\bseed=(\d+)")
THREADS = re.compile(r"\s*\bthreads=\d+")


def seeds_of(files: list[Path]) -> dict[str, dict[int, tuple[float, float]]]:
    """run name -> seed -> (final accuracy, uplink bytes per client and round)."""
    runs: dict[str, dict[int, tuple[float, float]]] = {}
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            found = SEED.search(row["run"])
            name = THREADS.sub("", SEED.sub("", row["run"])).strip()
            runs.setdefault(name, {}).setdefault(
                int(found.group(1)) if found else 0,
                (float(row["final_accuracy"]), float(row["uplink_bytes_per_client_round"])))
    return runs


def table(runs: dict[str, dict[int, tuple[float, float]]], names: list[str]) -> str:
    lines = ["| mirror run | seeds | accuracy after the last round, by seed | mean "
             "| uplink bytes |", "|---|---|---|---|---|"]
    for name in names:
        seeds = runs[name]
        values = [100 * seeds[s][0] for s in sorted(seeds)]
        nbytes = sum(b for _, b in seeds.values()) / len(seeds)
        lines.append(f"| {name} | {len(seeds)} | {', '.join(f'{v:.1f}' for v in values)} | "
                     f"{sum(values) / len(values):.1f}% | {nbytes:,.0f} |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, tuple[float, float]]], names: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4))
    for name in names:
        seeds = sorted(runs[name])
        nbytes = sum(b for _, b in runs[name].values()) / len(seeds)
        axis.plot(seeds, [100 * runs[name][s][0] for s in seeds], marker="o",
                  label=f"{name} ({nbytes:,.0f} B)")
    axis.set(xlabel="seed", ylabel="accuracy after the last round (%)",
             title="PyTorch mirror of the FSDD federation, seed by seed")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("png", type=Path, help="where the plot goes")
    parser.add_argument("files", type=Path, nargs="+", help="torch_mirror.py JSON lines")
    parser.add_argument("--runs", nargs="+", required=True,
                        help="run names (arguments without seed= and threads=)")
    args = parser.parse_args()
    runs = seeds_of(args.files)
    missing = [n for n in args.runs if n not in runs]
    if missing:
        raise SystemExit(f"no rows for {missing}; runs in the files: {sorted(runs)}")
    print(table(runs, args.runs))
    print("plot:", plot(runs, args.runs, args.png))


if __name__ == "__main__":
    main()
