"""``mgfl memory``: the exact arena of a training step, before anything is allocated."""

from __future__ import annotations

import json
from math import prod

import typer
from rich.console import Console
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors

console = Console()


@app.command()
def memory(
    model: str = typer.Option("dscnn", help="Zoo model: mlp, lenet5, dscnn, mobilenetv2, cnn1d."),
    batch: int = typer.Option(32, min=1, help="Samples per step."),
    freeze: str = typer.Option(
        "all",
        help=(
            "Trainable set: all, head, last:K, bias (TinyTL: biases and BatchNorm shifts; "
            "BatchNorms keep their running statistics, activations keep bit masks), bias+norm "
            "(also BatchNorm scales, whose gradients keep each BatchNorm's input), or names."
        ),
    ),
    optimizer: str = typer.Option("sgd", help="sgd (momentum state) or adam (two states)."),
    input_shape: str = typer.Option(None, help="Override the input shape, e.g. 1,49,10."),
    num_classes: int = typer.Option(None, help="Override the number of classes."),
    memory_budget: str = typer.Option(
        None, help="Also report the largest batch that fits this budget (e.g. 256MB)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the peak device memory of one training step broken down into parameters,
    gradients, optimizer state, activations and workspace. The peak is exact: it is the arena the
    engine would allocate, planned over the step's live intervals. The breakdown is what is alive
    at the step's busiest moment; fragmentation is what the placement needs beyond that."""
    from client_runtime.budget import format_bytes, largest_fitting_batch, parse_bytes
    from client_runtime.freezing import resolve_trainable
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import estimate_memory
    from mgfl.models.zoo import build_model

    with user_errors():
        shape = tuple(int(s) for s in input_shape.split(",")) if input_shape else None
        net = build_model(model, input_shape=shape, num_classes=num_classes)
        trainable = resolve_trainable(net, freeze)
        opt = OptimizerConfig(name=optimizer)
        estimate = estimate_memory(net, batch, trainable, opt)
        result = {
            "model": model,
            "freeze": freeze,
            "optimizer": optimizer,
            "trainable_parameters": sum(
                prod(s) for n, s in net.parameter_shapes().items() if n in trainable
            ),
            **estimate.to_dict(),
        }
        if memory_budget:
            budget = parse_bytes(memory_budget)
            result["memory_budget_bytes"] = budget
            result["largest_batch"] = largest_fitting_batch(
                lambda b: estimate_memory(net, b, trainable, opt).peak_bytes, budget, 1 << 16
            )
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = Table(title=f"{model}, batch {batch}, freeze {freeze}, {optimizer}")
    table.add_column("part")
    table.add_column("bytes", justify="right")
    table.add_column("", justify="right")
    for key in (
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "workspace",
        "fragmentation",
    ):
        table.add_row(key.replace("_", " "), f"{result[key]:,}", format_bytes(result[key]))
    table.add_row(
        "[bold]arena peak[/]",
        f"[bold]{result['peak_bytes']:,}[/]",
        format_bytes(result["peak_bytes"]),
    )
    console.print(table)
    if memory_budget:
        console.print(
            f"largest batch within {format_bytes(result['memory_budget_bytes'])}: "
            f"{result['largest_batch'] or 'none (does not fit at batch 1)'}"
        )
