"""``mgfl data``: the data sets mgfl can load, and how a partition spreads them over clients."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors

if TYPE_CHECKING:
    from mgfl.data import Dataset

data_app = typer.Typer(
    name="data", help="Data sets and federated partitions.", no_args_is_help=True
)
app.add_typer(data_app, name="data")

MAX_CLASS_COLUMNS = 12  # wider label sets are shown as one histogram string per client


@data_app.command()
def describe(
    data: str = typer.Option(
        "fsdd", "--data", help="fsdd, fsdd:/path/to/recordings, watch, mnist, fashion-mnist or "
        "synthetic:C,H,W:classes."
    ),
    scheme: str = typer.Option(
        "natural", "--partition", help="natural (one client per speaker/subject), iid or dirichlet."
    ),
    clients: int = typer.Option(None, "--clients", help="Client count (iid and dirichlet)."),
    alpha: float = typer.Option(0.5, "--alpha", help="Dirichlet concentration: small = skewed."),
    seed: int = typer.Option(0, "--seed", help="Seed of the partition."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Show a data set's shape and splits, and each client's sample count and label histogram
    under a partition of its training set."""
    from mgfl.data import load_dataset, partition

    with user_errors():
        dataset = _load_with_progress(data, load_dataset)
        parts = partition(
            dataset.y_train, dataset.groups_train, scheme=scheme, num_clients=clients,
            alpha=alpha, seed=seed,
        )
    summary = describe_partition(dataset, parts, scheme=scheme, alpha=alpha, seed=seed)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_tables(summary)


def describe_partition(
    dataset: Dataset, parts: list, *, scheme: str, alpha: float, seed: int
) -> dict[str, object]:
    """The facts ``describe`` prints, as plain data."""
    import numpy as np

    clients = []
    for index, part in enumerate(parts):
        groups = np.unique(dataset.groups_train[part])
        name = dataset.group_names[int(groups[0])] if scheme == "natural" else f"client-{index}"
        histogram = np.bincount(dataset.y_train[part], minlength=dataset.num_classes)
        clients.append(
            {"client": index, "name": name, "samples": len(part),
             "label_histogram": [int(c) for c in histogram]}
        )
    return {
        "data": dataset.name,
        "input_shape": list(dataset.input_shape),
        "classes": dataset.classes,
        "train_samples": len(dataset.y_train),
        "test_samples": len(dataset.y_test),
        "groups": dataset.group_names,
        "partition": {"scheme": scheme, "clients": len(parts), "alpha": alpha, "seed": seed},
        "clients": clients,
        "attribution": dataset.attribution,
    }


def _load_with_progress(spec: str, load_dataset) -> Dataset:
    """Feature extraction over thousands of recordings takes a while: show a bar on stderr."""
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"features of {spec}", total=None, visible=False)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, visible=True)

        return load_dataset(spec, progress=advance)


def _print_tables(summary: dict) -> None:
    console = Console()
    shape = " x ".join(map(str, summary["input_shape"]))
    console.print(
        f"[bold]{summary['data']}[/]: input {shape}, {len(summary['classes'])} classes, "
        f"{summary['train_samples']} train / {summary['test_samples']} test samples"
    )
    part = summary["partition"]
    title = f"{part['scheme']} partition over {part['clients']} clients"
    if part["scheme"] == "dirichlet":
        title += f" (alpha {part['alpha']:g}, seed {part['seed']})"
    elif part["scheme"] == "iid":
        title += f" (seed {part['seed']})"
    table = Table(title=title)
    table.add_column("client", no_wrap=True)
    table.add_column("samples", justify="right")
    classes = summary["classes"]
    wide = len(classes) > MAX_CLASS_COLUMNS
    if wide:
        table.add_column("label histogram")
    else:
        for label in classes:
            table.add_column(label, justify="right")
    for client in summary["clients"]:
        counts = [str(c) for c in client["label_histogram"]]
        cells = [" ".join(counts)] if wide else counts
        table.add_row(client["name"], str(client["samples"]), *cells)
    console.print(table)
    console.print(summary["attribution"], style="dim", markup=False, highlight=False)
