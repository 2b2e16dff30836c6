"""``mgfl train``: centralised training of a zoo model on one OpenCL device."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors

console = Console()


def synthetic_spec(model_name: str) -> str:
    """``--data synthetic``: random inputs of the model's default shape."""
    from mgfl.models.zoo import ZOO

    if model_name not in ZOO:
        raise ValueError(f"Unknown model {model_name!r}; the zoo holds {', '.join(sorted(ZOO))}")
    entry = ZOO[model_name]
    shape = ",".join(str(s) for s in entry.default_input_shape)
    return f"synthetic:{shape}:{entry.default_num_classes}"


def load_for_model(data: str, model_name: str, **model_options):
    """The data set and the model shaped for it (input shape and class count): a zoo model, or
    the model of an .onnx file, whose weights are then its initial state."""
    from mgfl.data.registry import load_dataset
    from mgfl.onnx_import import build_or_import_model, is_onnx_path

    if data == "synthetic" and is_onnx_path(model_name):
        imported = build_or_import_model(model_name)
        shape = ",".join(str(s) for s in imported.input_shape)
        data = f"synthetic:{shape}:{imported.num_classes}"
    spec = synthetic_spec(model_name) if data == "synthetic" else data
    dataset = load_dataset(spec)
    model = build_or_import_model(
        model_name,
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        **model_options,
    )
    return dataset, model


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


@app.command()
def train(
    model: str = typer.Option(
        "dscnn",
        help="Zoo model (mlp, lenet5, dscnn, mobilenetv2, cnn1d) or an .onnx file to fine-tune.",
    ),
    data: str = typer.Option(
        "fsdd",
        help="fsdd (embedded), fsdd:/path/to/recordings, watch, mnist, fashion-mnist, "
        "or synthetic (random inputs of the model's shape).",
    ),
    batch: int = typer.Option(32, min=1, help="Samples per step."),
    epochs: int = typer.Option(10, min=1, help="Passes over the training set."),
    steps: int = typer.Option(None, min=1, help="Train this many steps instead of --epochs."),
    lr: float = typer.Option(0.05, help="Learning rate."),
    optimizer: str = typer.Option("sgd", help="sgd (with momentum) or adam."),
    momentum: float = typer.Option(0.9, help="SGD momentum."),
    weight_decay: float = typer.Option(0.0, help="L2 weight decay."),
    nesterov: bool = typer.Option(False, help="Nesterov momentum."),
    freeze: str = typer.Option("all", help="Trainable set: all, head, last:K, bias, or names."),
    memory_budget: str = typer.Option(
        None,
        help="Device memory to stay within, e.g. 256MB (default: a quarter of the device's global "
        "memory). A batch that does not fit runs as micro-batches with gradient accumulation.",
    ),
    device: str = typer.Option(
        None,
        help="OpenCL device (index, gpu/cpu, or part of its name); default MGFL_DEVICE, else "
        "auto: a GPU if present, and the CPU (with a warning) if that GPU fails to build or is "
        "lost during training.",
    ),
    seed: int = typer.Option(0, help="Seed of initial weights and batch order."),
    json_path: Path = typer.Option(None, "--json", help="Write the results to this JSON file."),
    save: Path = typer.Option(None, help="Save the trained weights to this .npz file."),
) -> None:
    """Train a model on one OpenCL device with every tensor resident on it: per step only the
    batch goes up, nothing comes back until a report. Prints loss, accuracy, median step time,
    samples/s, the share of device time spent moving data, and the arena's peak memory."""
    from client_runtime.budget import DEFAULT_BUDGET_FRACTION, parse_bytes
    from client_runtime.device_fallback import run_with_fallback
    from client_runtime.freezing import resolve_trainable
    from client_runtime.graph import OptimizerConfig
    from client_runtime.trainer import TrainConfig
    from client_runtime.trainer import train as run_training

    with user_errors():
        dataset, net = load_for_model(data, model)
        trainable = resolve_trainable(net, freeze)
        opt = OptimizerConfig(
            name=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov
        )
        budget_bytes = parse_bytes(memory_budget) if memory_budget else None
        state = net.init_state(seed)  # an imported model's init_state is its file's weights

    def train_on(dev):
        budget = budget_bytes or int(dev.info.global_mem_bytes * DEFAULT_BUDGET_FRACTION)
        config = TrainConfig(
            batch=batch, epochs=epochs, steps=steps, seed=seed, memory_budget=budget
        )
        console.print(
            f"[bold]{net.name}[/] ({net.parameter_count():,} parameters, {len(trainable)} "
            f"trainable arrays) on [bold]{dataset.name}[/] ({len(dataset.y_train):,} train / "
            f"{len(dataset.y_test):,} test) | device {dev.info.describe()}"
        )
        columns = (
            TextColumn("training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("train", total=None)

            def progress(done: int, total: int, _info) -> None:
                bar.update(task, completed=done, total=total)

            return run_training(
                dev,
                net,
                state,
                dataset.x_train,
                dataset.y_train,
                config,
                opt,
                trainable,
                dataset.x_test,
                dataset.y_test,
                progress=progress,
            )

    with user_errors():
        # Under --device auto a GPU lost mid-way (a driver reset) trains again on the CPU.
        (result, step), dev = run_with_fallback(train_on, device)
    _print_result(result, batch)
    payload = {
        "model": net.name,
        "data": dataset.name,
        "device": dev.info.to_dict(),
        "batch": batch,
        "optimizer": opt.__dict__,
        "freeze": freeze,
        "launches_per_step": step.launches_per_step(),
        **result.to_dict(),
    }
    if json_path:
        json_path.write_text(json.dumps(payload, indent=2))
        console.print(f"results written to {json_path}")
    if save:
        import numpy as np

        np.savez(save, **step.get_state())
        console.print(f"weights written to {save}")


def _print_result(result, batch: int) -> None:
    table = Table(show_header=False, box=None)
    rows = [
        ("final training loss", f"{result.final_loss:.4f}"),
        ("training accuracy (last epoch)", f"{result.train_accuracy:.2%}"),
    ]
    if result.accuracy is not None:
        rows.append(("test accuracy", f"{result.accuracy:.2%}"))
    rows += [
        ("median step time", f"{result.step_time_s * 1e3:.2f} ms (batch {batch})"),
        ("samples/s", f"{result.samples_per_s:,.0f}"),
        ("data-movement share", f"{result.data_movement_share:.2%} of device time"),
        ("host->device per step", _fmt_bytes(result.h2d_bytes_per_step)),
        ("device->host per step", _fmt_bytes(result.d2h_bytes_per_step)),
        ("peak device memory (arena)", _fmt_bytes(result.peak_device_bytes)),
    ]
    if result.accumulation_steps > 1:
        rows.append(
            (
                "micro-batching",
                f"{result.accumulation_steps} x {result.micro_batch} samples (memory budget)",
            )
        )
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
