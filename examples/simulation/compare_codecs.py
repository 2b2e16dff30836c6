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


def uplink_per_client_round(history: dict) -> float:
    trained = [r for r in history["rounds"] if r["round"] > 0 and r["clients"]]
    return sum(r["uplink_bytes"] / r["clients"] for r in trained) / len(trained)


def summarize(histories: dict[str, dict]) -> str:
    """A Markdown table; ratios and accuracy differences refer to the ``none`` run."""
    base = histories.get("none")
    lines = ["| uplink codec | rounds | final accuracy | best accuracy | uplink bytes per "
             "client and round | ratio vs float32 | accuracy vs float32 |",
             "|---|---|---|---|---|---|---|"]
    for codec, history in histories.items():
        rounds = len(history["rounds"]) - 1
        per_client = uplink_per_client_round(history)
        final = history["final_accuracy"]
        best = max(r["accuracy"] for r in history["rounds"])
        ratio = uplink_per_client_round(base) / per_client if base else float("nan")
        delta = 100 * (final - base["final_accuracy"]) if base else float("nan")
        lines.append(f"| {codec} | {rounds} | {100 * final:.1f}% | {100 * best:.1f}% | "
                     f"{per_client:,.0f} | {ratio:.1f}x | {delta:+.1f} points |")
    return "\n".join(lines)


def load(out: Path) -> dict[str, dict]:
    histories = {}
    for codec in CODECS:
        path = out / f"{file_name(codec)}.json"
        if path.exists():
            histories[codec] = json.loads(path.read_text())
    return histories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("runs/codecs"))
    parser.add_argument("--codecs", nargs="+", default=list(CODECS))
    parser.add_argument("--client-cpus", type=float, default=1.0)
    parser.add_argument("--summarize", type=Path, help="Only print the table of earlier runs.")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(load(args.summarize)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for codec in args.codecs:
        history = run(codec, args.rounds, args.out, args.client_cpus)
        print(f"{codec}: final accuracy {history['final_accuracy']:.2%}", flush=True)
    print(summarize(load(args.out)))


if __name__ == "__main__":
    main()
