"""Run several federations at once, each in its own process with its clients in-process
(``in_process.py``), and print a table of their final accuracy and uplink bytes.

    python examples/simulation/sweep.py OUT --workers 6 "codec=none" "codec=stc:0.023 lr=0.004"

Each argument after OUT is one run's config (``key=value`` pairs on top of the defaults);
OUT/<k>.json holds run k's history and OUT/<k>.log its output; OUT/sweep.json the summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compare_codecs import uplink_per_client_round

HERE = Path(__file__).resolve().parent


def run_one(out: Path, index: int, config: str, timeout_s: float) -> dict:
    history_dir = out / f"run{index}"
    args = [sys.executable, str(HERE / "in_process.py"), f"output-dir={history_dir}",
            *config.split()]
    started = time.time()
    with open(out / f"{index}.log", "w") as log:
        try:
            code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = -1
    history_path = history_dir / "history.json"
    row = {"config": config, "returncode": code, "wall_s": round(time.time() - started, 1)}
    if history_path.exists():
        history = json.loads(history_path.read_text())
        (out / f"{index}.json").write_text(json.dumps(history))
        trained = [r for r in history["rounds"] if r["round"] > 0 and r["clients"]]
        row["rounds"] = len(trained)
        row["accuracy"] = [round(r["accuracy"], 4) for r in history["rounds"]]
        row["final"] = history["rounds"][-1]["accuracy"]
        row["uplink_per_client_round"] = (uplink_per_client_round(history["rounds"])
                                          if trained else 0.0)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_one, args.out, k, c, args.timeout)
                   for k, c in enumerate(args.configs)]
        rows = []
        for future in futures:
            row = future.result()
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "accuracy"}), flush=True)
    (args.out / "sweep.json").write_text(json.dumps(rows, indent=1))
    for row in rows:
        acc = row.get("accuracy", [])
        print(f"{row.get('final', float('nan')):.3f} {row.get('uplink_per_client_round', 0):9.0f} "
              f"{row['wall_s']:6.0f}s  {row['config']}  last5={acc[-5:]}")


if __name__ == "__main__":
    main()
