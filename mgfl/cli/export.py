"""``mgfl export``: write a model and its weights as an ONNX file for other runtimes."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from mgfl.cli import app
from mgfl.cli.errors import user_errors

console = Console()


def load_weights(path: Path, expected: dict[str, tuple[int, ...]]) -> dict:
    """The arrays of a ``mgfl train --save`` file, checked against the model's names."""
    import numpy as np

    with np.load(path, allow_pickle=False) as saved:  # a weights file may come from anywhere
        weights = {name: saved[name] for name in saved.files}
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(
            f"{path} lacks {', '.join(missing[:5])}: was it saved from this model with the same "
            "--data?"
        )
    return {name: weights[name] for name in expected}


@app.command()
def export(
    model: str = typer.Option(..., help="Zoo model (mlp, lenet5, ...) or an .onnx file."),
    out: Path = typer.Option(..., help="The ONNX file to write."),
    weights: Path = typer.Option(
        None, help="Weights saved by `mgfl train --save` (default: the initial weights)."
    ),
    data: str = typer.Option(
        None,
        help="The data set the model was trained on, which sets its input shape and classes "
        "(as in mgfl train); default: the zoo model's own shape.",
    ),
    seed: int = typer.Option(0, help="Seed of the initial weights when --weights is not given."),
) -> None:
    """Export a model to ONNX (opset 13): BatchNorm in inference form with its running
    statistics, Dropout left out, residual blocks as Add. `mgfl train --model FILE.onnx` reads
    it back."""
    from mgfl.onnx_export import export_onnx
    from mgfl.onnx_import import build_or_import_model

    with user_errors():
        if data:
            from mgfl.cli.train import load_for_model

            _, net = load_for_model(data, model)
        else:
            net = build_or_import_model(model)
        expected = {**net.parameter_shapes(), **net.buffer_shapes()}
        state = load_weights(weights, expected) if weights else net.init_state(seed)
        export_onnx(net, state, out)
    source = f"weights of {weights}" if weights else f"initial weights (seed {seed})"
    console.print(f"{net.name} ({net.parameter_count():,} parameters, {source}) written to {out}")
