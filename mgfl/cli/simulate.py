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
from mgfl.device_profiles import PROFILES

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
    """Accuracy (left) and bytes per round (middle, log scale) of one run; with simulated phones,
    a third panel of accuracy against simulated wall-clock time, with each round's stragglers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rounds = history["rounds"]
    trained = [r for r in rounds if r["round"] > 0]
    simulated = any(r.get("wall_clock_s") is not None for r in rounds)
    fig, axes = plt.subplots(1, 3 if simulated else 2, figsize=(15 if simulated else 10, 3.8))
    left, right = axes[0], axes[1]
    left.plot([r["round"] for r in rounds], [100 * (r["accuracy"] or 0) for r in rounds],
              marker="o")
    if int(history.get("run", {}).get("config", {}).get("statistics-every", 1)) > 1:
        # between these rounds the server evaluates with older BatchNorm statistics
        fresh = [r for r in trained if r.get("statistics_replies")]
        left.plot([r["round"] for r in fresh], [100 * (r["accuracy"] or 0) for r in fresh],
                  "D", color="C3", label="statistics sent")
        left.legend()
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
    if simulated:
        _plot_simulated_time(axes[2], rounds)
    config = history.get("run", {}).get("config", {})
    title = (f"{config.get('strategy', '')} | {config.get('model', '')} on "
             f"{config.get('dataset', '')} | uplink codec {config.get('codec', '')}")
    if simulated:
        title += f" | devices {config.get('devices', '')}"
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_simulated_time(axis, rounds: list[dict]) -> None:
    """Accuracy against the simulated wall clock; each round's stragglers as a bar spanning the
    round's simulated length, on a second axis."""
    from matplotlib.ticker import MaxNLocator

    clock = [r["wall_clock_s"] or 0.0 for r in rounds]
    axis.plot(clock, [100 * (r["accuracy"] or 0) for r in rounds], marker="o", color="C0")
    axis.set(xlabel="simulated wall-clock time (s)", ylabel="server test accuracy (%)",
             title="simulated phones")
    axis.grid(alpha=0.3)
    trained = [(c, r) for c, r in zip(clock, rounds, strict=True) if r["round"] > 0]
    if not trained:
        return
    bars = axis.twinx()
    bars.bar([c - (r["round_s"] or 0.0) for c, r in trained], [r["stragglers"] for _, r in trained],
             width=[r["round_s"] or 0.0 for _, r in trained], align="edge", color="C3",
             alpha=0.3, edgecolor="C3", label="stragglers (bar = round)")
    bars.set_ylabel("stragglers per round")
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    bars.legend(loc="lower right")
    axis.set_zorder(bars.get_zorder() + 1)  # the accuracy line in front of the bars
    axis.patch.set_visible(False)


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
    devices: str = typer.Option(
        None, "--devices", help="Simulate phones: 'mix' gives each client one of the profiled "
        "phone GPUs (seeded), a profile name gives it to all (" + ", ".join(PROFILES) + "). "
        "Each client's app memory budget then drives its batch, and its predicted training "
        "plus uplink time gives a simulated round time (docs/deploy.md)."),
    over_selection: float = typer.Option(
        None, "--over-selection", min=0.0, help="With --devices: sample this share more clients "
        "than a round needs (0.3 = 30% more) and aggregate only the first to finish."),
    round_deadline_s: float = typer.Option(
        None, "--round-deadline-s", min=0.0, help="With --devices: simulated seconds a round "
        "waits; later clients are stragglers (0 = no deadline)."),
    uplink_mbps: float = typer.Option(
        None, "--uplink-mbps", help="With --devices: median client uplink in Mbit/s (each "
        "client's is drawn lognormally around it; default 10)."),
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
             "device": device, "devices": devices, "over-selection": over_selection,
             "round-deadline-s": round_deadline_s, "uplink-mbps": uplink_mbps}
    with user_errors():
        values = {**parse_pairs(config or []), **{k: v for k, v in named.items() if v is not None},
                  "output-dir": str(output_dir)}
        run_config = RunConfig.from_mapping(values)
    console.print(
        f"[bold]{run_config.strategy}[/] on [bold]{run_config.dataset}[/] "
        f"({run_config.partition}) | {run_config.model} | uplink {run_config.codec}, downlink "
        f"{run_config.downlink_codec} | {run_config.num_rounds} rounds"
        + (f" | phones {run_config.devices}, over-selection {run_config.over_selection:g}, "
           f"deadline {run_config.round_deadline_s:g} s" if run_config.devices else "")
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
                if record.get("wall_clock_s") is not None:
                    status += (f" | {record['stragglers']} stragglers | simulated "
                               f"{record['wall_clock_s']:.1f} s")
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
    if history.get("simulated_wall_clock_s") is not None:
        table.add_row("simulated wall clock", f"{history['simulated_wall_clock_s']:.1f} s")
        table.add_row("stragglers, all rounds", str(sum(r["stragglers"] for r in trained)))
    console.print(table)
