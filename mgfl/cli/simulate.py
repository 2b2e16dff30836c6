"""``mgfl simulate``: a federated run on Flower's simulation engine with the project's apps, a
progress line per round, and the results as JSON and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors

console = Console()
DEFAULT_OUTPUT = Path("mgfl-run")


def _fmt_bytes(n: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def parse_pairs(pairs: list[str]) -> dict[str, object]:
    """``["lr=0.1", "codec=topk:0.01"]`` -> typed values (int, float, else string)."""
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--config takes KEY=VALUE, got {pair!r}")
        text = text.strip()
        for kind in (int, float):
            try:
                values[key.strip()] = kind(text)
                break
            except ValueError:
                continue
        else:
            values[key.strip()] = text.strip("\"'")
    return values


def plot_history(history: dict, path: Path) -> Path:
    """Accuracy (left) and bytes per round (right, log scale) of one run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rounds = history["rounds"]
    trained = [r for r in rounds if r["round"] > 0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot([r["round"] for r in rounds], [100 * (r["accuracy"] or 0) for r in rounds],
              marker="o")
    left.set(xlabel="round", ylabel="server test accuracy (%)", title="accuracy")
    left.grid(alpha=0.3)
    right.plot([r["round"] for r in trained], [r["uplink_bytes"] for r in trained],
               marker="o", label="uplink")
    right.plot([r["round"] for r in trained], [r["downlink_bytes"] for r in trained],
               marker="s", label="downlink")
    right.set(xlabel="round", ylabel="bytes per round", title="traffic", yscale="log")
    right.grid(alpha=0.3)
    right.legend()
    for axis in (left, right):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    config = history.get("run", {}).get("config", {})
    fig.suptitle(f"{config.get('strategy', '')} | {config.get('model', '')} on "
                 f"{config.get('dataset', '')} | uplink codec {config.get('codec', '')}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@app.command()
def simulate(
    rounds: int = typer.Option(None, "--rounds", min=1, help="Federated rounds (default 20)."),
    data: str = typer.Option(None, "--data", help="Data set (default fsdd, the embedded one)."),
    model: str = typer.Option(None, help="Zoo model (default dscnn)."),
    partition: str = typer.Option(None, help="natural (one client per speaker), iid, dirichlet."),
    clients: int = typer.Option(None, "--clients", min=1, help="Clients for iid/dirichlet."),
    alpha: float = typer.Option(None, help="Dirichlet concentration (small = skewed)."),
    strategy: str = typer.Option(
        None, help="fedavg, fedprox, fedadam, fedavgm, fedmedian, fedtrimmedavg or krum."),
    codec: str = typer.Option(
        None, help="Uplink codec: none, fp16, int8, int8-channel, topk:F (e.g. topk:0.01)."),
    fraction: float = typer.Option(None, "--fraction", help="Share of clients per round."),
    epochs: int = typer.Option(None, help="Local epochs per round."),
    local_steps: int = typer.Option(None, "--local-steps", help="Local steps instead of epochs."),
    batch: int = typer.Option(None, help="Local batch size."),
    lr: float = typer.Option(None, help="Local learning rate."),
    freeze: str = typer.Option(None, help="Trainable set: all, head, last:K, bias, names."),
    device: str = typer.Option(None, help="OpenCL device of clients and server evaluation."),
    config: Annotated[list[str] | None, typer.Option(
        "--config", "-c", help="Any run-config KEY=VALUE (the keys of pyproject's "
        "tool.flwr.app.config); repeatable.")] = None,
    output_dir: Annotated[Path, typer.Option(
        "--output-dir", help="Checkpoints, history.json and the plot go here.")] = DEFAULT_OUTPUT,
    json_path: Annotated[Path | None, typer.Option(
        "--json", help="Write the run's results to this file.")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="PNG plot of accuracy and bytes per round (default OUTPUT_DIR/rounds.png).")] = None,
    client_cpus: float = typer.Option(1.0, help="CPUs Ray reserves per client (fractions ok)."),
    client_gpus: float = typer.Option(0.0, help="GPUs Ray reserves per client."),
    ray_address: str = typer.Option(None, "--ray-address",
                                    help="Join an existing Ray cluster (e.g. 10.0.0.5:6379)."),
    verbose: bool = typer.Option(False, help="Show Flower's and Ray's logs."),
) -> None:
    """Run a federated simulation on Flower's engine (Ray) with mgfl's ServerApp and ClientApp.

    With no options: the embedded FSDD digits, one client per speaker, DS-CNN, FedAvg.

    The server evaluates the global model on the held-out test takes after every round and
    saves it as OUTPUT_DIR/round-NNN.npz."""
    from mgfl.run_config import RunConfig
    from server.events import add_round_listener, remove_round_listener
    from server.simulation import run_simulation

    named = {"num-rounds": rounds, "dataset": data, "model": model, "partition": partition,
             "num-clients": clients, "dirichlet-alpha": alpha, "strategy": strategy,
             "codec": codec, "fraction-train": fraction, "epochs": epochs,
             "local-steps": local_steps, "batch": batch, "lr": lr, "freeze": freeze,
             "device": device}
    with user_errors():
        values = {**parse_pairs(config or []), **{k: v for k, v in named.items() if v is not None},
                  "output-dir": str(output_dir)}
        run_config = RunConfig.from_mapping(values)
    console.print(
        f"[bold]{run_config.strategy}[/] on [bold]{run_config.dataset}[/] "
        f"({run_config.partition}) | {run_config.model} | uplink {run_config.codec}, downlink "
        f"{run_config.downlink_codec} | {run_config.num_rounds} rounds"
    )
    columns = (TextColumn("round"), MofNCompleteColumn(), BarColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("rounds", total=run_config.num_rounds, status="starting Ray...")

        def on_round(record: dict) -> None:
            accuracy = record["accuracy"]
            status = (f"accuracy {accuracy:.2%}" if accuracy is not None else "accuracy n/a")
            if record["round"] > 0:
                status += (f" | up {_fmt_bytes(record['uplink_bytes'])} down "
                           f"{_fmt_bytes(record['downlink_bytes'])} | {record['clients']} "
                           "clients")
                if record["failed"] or record["rejected"]:
                    status += f" ({record['failed']} failed, {record['rejected']} rejected)"
            bar.update(task, completed=record["round"], status=status)

        add_round_listener(on_round)
        try:
            with user_errors():
                history = run_simulation(run_config, client_cpus=client_cpus,
                                         client_gpus=client_gpus, ray_address=ray_address,
                                         verbose=verbose)
        finally:
            remove_round_listener(on_round)
    _print_summary(history)
    troubles = [r for r in history["rounds"] if r["failed"] or r["rejected"]]
    if troubles:
        console.print(f"[bold yellow]warning:[/] {len(troubles)} round(s) lost client updates "
                      "(failed clients or rejected updates); run with --verbose to see why")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(history, indent=2))
        console.print(f"results written to {json_path}")
    plot_path = plot_history(history, plot or output_dir / "rounds.png")
    console.print(f"plot written to {plot_path}")


def _print_summary(history: dict) -> None:
    table = Table(show_header=False, box=None)
    trained = [r for r in history["rounds"] if r["round"] > 0]
    rows = [("initial accuracy", history["initial_accuracy"]),
            ("final accuracy", history["final_accuracy"])]
    for label, value in rows:
        table.add_row(label, "n/a" if value is None else f"{value:.2%}")
    table.add_row("uplink, all rounds", _fmt_bytes(history["total_uplink_bytes"]))
    table.add_row("downlink, all rounds", _fmt_bytes(history["total_downlink_bytes"]))
    if trained and trained[-1]["clients"]:
        per_client = trained[-1]["uplink_bytes"] / trained[-1]["clients"]
        table.add_row("uplink per client, last round", _fmt_bytes(per_client))
    console.print(table)
