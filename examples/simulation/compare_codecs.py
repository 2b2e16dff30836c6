"""FedAvg on the embedded FSDD digits (one client per speaker, DS-CNN) once per uplink codec, and
a table of accuracy, uplink bytes and compression ratio against float32 updates.

    python examples/simulation/compare_codecs.py --rounds 20 --out runs/codecs
    python examples/simulation/compare_codecs.py --summarize runs/codecs   # table only

Each run is ``mgfl simulate`` with the defaults and ``--codec``; its history lands in
``OUT/<codec>.json`` (and checkpoints under ``OUT/<codec>/``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CODECS = ("none", "fp16", "int8", "int8-channel", "topk:0.01", "topk:0.001")


def file_name(codec: str) -> str:
    return codec.replace(":", "-")


def run(codec: str, rounds: int, out: Path, client_cpus: float) -> dict:
    from mgfl.run_config import RunConfig
    from server.simulation import run_simulation

    config = RunConfig.from_mapping({"num-rounds": rounds, "codec": codec,
                                     "output-dir": str(out / file_name(codec))})
    history = run_simulation(config, client_cpus=client_cpus)
    (out / f"{file_name(codec)}.json").write_text(json.dumps(history, indent=2))
    return history


def rounds_up_to(history: dict, last: int | None) -> list[dict]:
    """Round 0 and the trained rounds up to ``last`` (all of them when None)."""
    return [r for r in history["rounds"] if last is None or r["round"] <= last]


def uplink_per_client_round(rounds: list[dict]) -> float:
    trained = [r for r in rounds if r["round"] > 0 and r["clients"]]
    return sum(r["uplink_bytes"] / r["clients"] for r in trained) / len(trained)


def summarize(histories: dict[str, dict], at_round: int | None = None) -> str:
    """A Markdown table of every run cut at ``at_round`` (default: each run's last round);
    ratios and accuracy differences refer to the ``none`` run cut at the same round."""
    base = rounds_up_to(histories["none"], at_round) if "none" in histories else None
    lines = ["| uplink codec | round | accuracy | best accuracy so far | uplink bytes per "
             "client and round | ratio vs float32 | accuracy vs float32 |",
             "|---|---|---|---|---|---|---|"]
    for codec, history in histories.items():
        rounds = rounds_up_to(history, at_round)
        per_client = uplink_per_client_round(rounds)
        accuracy = rounds[-1]["accuracy"]
        best = max(r["accuracy"] for r in rounds)
        ratio = uplink_per_client_round(base) / per_client if base else float("nan")
        delta = 100 * (accuracy - base[-1]["accuracy"]) if base else float("nan")
        lines.append(f"| {codec} | {rounds[-1]['round']} | {100 * accuracy:.1f}% | "
                     f"{100 * best:.1f}% | {per_client:,.0f} | {ratio:.1f}x | "
                     f"{delta:+.1f} points |")
    return "\n".join(lines)


def plot_comparison(histories: dict[str, dict], path: Path) -> Path:
    """Server accuracy per round of every run (left), uplink bytes per client and round (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for codec, history in histories.items():
        rounds = history["rounds"]
        left.plot([r["round"] for r in rounds], [100 * r["accuracy"] for r in rounds],
                  marker=".", label=codec)
    left.set(xlabel="round", ylabel="server test accuracy (%)", title="FedAvg, FSDD by speaker")
    left.grid(alpha=0.3)
    left.legend()
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    names = list(histories)
    right.bar(names, [uplink_per_client_round(histories[n]["rounds"]) for n in names])
    right.set(ylabel="uplink bytes per client and round", yscale="log", title="uplink")
    right.tick_params(axis="x", rotation=30)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load(out: Path) -> dict[str, dict]:
    """Every run's history in ``out``: the codecs of ``CODECS`` in that order, then any other
    (e.g. ``stc-0.1.json`` from ``--codecs stc:0.1``), by name."""
    histories = {}
    known = {file_name(codec): codec for codec in CODECS}
    for path in sorted(out.glob("*.json"), key=lambda p: (p.stem not in known,
                                                          list(known).index(p.stem)
                                                          if p.stem in known else 0, p.stem)):
        history = json.loads(path.read_text())
        if isinstance(history, dict) and "rounds" in history:
            codec = known.get(path.stem, path.stem.replace("-", ":", 1))
            histories[codec] = history
    return histories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("runs/codecs"))
    parser.add_argument("--codecs", nargs="+", default=list(CODECS))
    parser.add_argument("--client-cpus", type=float, default=1.0)
    parser.add_argument("--summarize", type=Path, help="Only print the table of earlier runs.")
    parser.add_argument("--at-round", type=int, help="Compare the runs at this round.")
    parser.add_argument("--plot", type=Path, help="Also draw the runs into this PNG.")
    args = parser.parse_args()
    if args.summarize:
        histories = load(args.summarize)
        print(summarize(histories, args.at_round))
        if args.plot:
            plot_comparison(histories, args.plot)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for codec in args.codecs:
        history = run(codec, args.rounds, args.out, args.client_cpus)
        print(f"{codec}: final accuracy {history['final_accuracy']:.2%}", flush=True)
    histories = load(args.out)
    print(summarize(histories, args.at_round))
    if args.plot:
        plot_comparison(histories, args.plot)


if __name__ == "__main__":
    main()
