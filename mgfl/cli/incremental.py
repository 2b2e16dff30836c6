"""``mgfl incremental``: class-incremental learning on one OpenCL device, with its baselines."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors

console = Console()


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


@app.command()
def incremental(
    data: str = typer.Option("fsdd", help="Data set (see mgfl data describe)."),
    tasks: int = typer.Option(5, min=1, help="Number of tasks (increments)."),
    classes_per_task: int = typer.Option(
        None, min=1, help="New classes per task (default: the classes split evenly)."
    ),
    model: str = typer.Option("mlp", help="Zoo model whose last layer is the growing head."),
    memory: int = typer.Option(200, min=0, help="Exemplar budget in samples."),
    memory_bytes: str = typer.Option(
        None, help="Exemplar budget in bytes as well, e.g. 512KB (the stricter one holds)."
    ),
    exemplar_dtype: str = typer.Option("float32", help="Exemplar storage: float32, float16, int8."),
    selection: str = typer.Option("herding", help="herding (iCaRL) or nme (FastICARL)."),
    classifier: str = typer.Option("head", help="Predict by the head or by nme (nearest mean)."),
    epochs: int = typer.Option(25, min=1, help="Epochs per task."),
    batch: int = typer.Option(32, min=1, help="Samples per step."),
    optimizer: str = typer.Option("adam", help="sgd or adam."),
    lr: float = typer.Option(0.001, help="Learning rate."),
    temperature: float = typer.Option(2.0, help="Distillation temperature."),
    distill_weight: float = typer.Option(1.0, help="Weight of the distillation loss."),
    balanced: bool = typer.Option(True, help="Draw batches class-balanced (exemplars vs new)."),
    baselines: bool = typer.Option(True, help="Also run fine-tuning and joint training."),
    seed: int = typer.Option(0, help="Seed of the weights and batch order."),
    clients: int = typer.Option(
        0, min=0, help="Federated: this many clients (IID shares) learn the tasks; 0: one device."
    ),
    rounds_per_task: int = typer.Option(
        3, min=1, help="Federated: rounds each client spends on a task."
    ),  # fmt: skip
    stagger: int = typer.Option(
        1, min=0, help="Federated: clients meet a task over this many extra rounds."
    ),
    local_epochs: int = typer.Option(2, min=1, help="Federated: local epochs per round."),
    flower: bool = typer.Option(
        True, help="Federated: run on Flower's simulation engine (else clients run in-process)."
    ),
    device: str = typer.Option(None, help="OpenCL device (index, gpu/cpu, or part of its name)."),
    json_path: Path = typer.Option(None, "--json", help="Write the results to this JSON file."),
    plot: Path = typer.Option(None, help="Write the accuracy-per-task plot to this PNG."),
) -> None:
    """Learn the classes of a data set task after task on the device (iCaRL: exemplar memory,
    distillation from the previous model, growing head) and compare with fine-tuning (lower
    bound) and joint training (upper bound). Prints the accuracy matrix, the time and peak memory
    of each increment, and the final metrics."""
    from client_runtime.budget import parse_bytes
    from client_runtime.continual.experiment import class_tasks, run_experiment
    from client_runtime.continual.learner import IncrementalConfig
    from client_runtime.device import Device
    from mgfl.cli.train import load_for_model
    from mgfl.models.zoo import build_model

    if clients:
        with user_errors():
            federated_config = _federated_config(
                data, model, clients, tasks, classes_per_task, rounds_per_task, stagger, memory,
                exemplar_dtype, selection, local_epochs, batch, lr, seed, device, json_path,
            )  # fmt: skip
        _federated(federated_config, flower, json_path, plot)
        return
    with user_errors():
        dataset, _ = load_for_model(data, model)
        split = class_tasks(dataset.num_classes, tasks, classes_per_task)
        net = build_model(model, input_shape=dataset.input_shape, num_classes=len(split[0]))
        config = IncrementalConfig(
            memory=memory,
            memory_bytes=parse_bytes(memory_bytes) if memory_bytes else None,
            exemplar_dtype=exemplar_dtype,
            selection=selection,
            classifier=classifier,
            epochs=epochs,
            batch=batch,
            optimizer=optimizer,
            lr=lr,
            temperature=temperature,
            distill_weight=distill_weight,
            balanced=balanced,
            seed=seed,
        )
        dev = Device.open(device)
    console.print(
        f"[bold]{net.name}[/] on [bold]{dataset.name}[/]: {tasks} tasks {split} | "
        f"device {dev.info.describe()}"
    )

    def on_task(method: str, report, row: list[float]) -> None:
        accs = " ".join(f"{a:.0%}" for a in row)
        console.print(
            f"  {method:8s} task {report.task}: {report.seconds:6.1f} s, peak device "
            f"{_mib(report.peak_device_bytes)}, host RSS {_mib(report.peak_host_rss_bytes)}, "
            f"exemplars {report.exemplars} ({_mib(report.exemplar_bytes)}) | accuracy {accs}"
        )

    with user_errors():
        result = run_experiment(dev, net, dataset, split, config, baselines, on_task)
    result["data"], result["model"] = dataset.name, net.name
    result["device"] = dev.info.to_dict()
    _print(result)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
        console.print(f"results written to {json_path}")
    if plot:
        from mgfl.continual_plot import plot_incremental

        plot_incremental(result, plot, f"{net.name} on {dataset.name}, {tasks} tasks")
        console.print(f"plot written to {plot}")


def _federated_config(data, model, clients, tasks, classes_per_task, rounds_per_task, stagger,
                      memory, exemplar_dtype, selection, epochs, batch, lr, seed, device,
                      json_path):  # fmt: skip
    from mgfl.continual_federation import FederatedIncrementalConfig
    from mgfl.data.registry import load_dataset

    per_task = classes_per_task or load_dataset(data).num_classes // tasks
    return FederatedIncrementalConfig(
        dataset=data, model=model, num_clients=clients, tasks=tasks, classes_per_task=per_task,
        rounds_per_task=rounds_per_task, stagger=stagger, memory=memory,
        exemplar_dtype=exemplar_dtype, selection=selection, epochs=epochs, batch=batch, lr=lr,
        seed=seed, device=device or "",
        output=str(json_path.with_suffix(".flower.json")) if json_path else "mgfl-fcl.json",
    )  # fmt: skip


def _federated(config, flower: bool, json_path: Path | None, plot: Path | None) -> None:
    """Federated class-incremental learning in simulation, with a line per round."""
    import time

    from server.continual_simulation import simulate, simulate_with_flower

    console.print(
        f"federated: {config.num_clients} clients, {config.tasks} tasks over "
        f"{config.num_rounds} rounds ({config.rounds_per_task} per task, stagger {config.stagger})"
    )
    start = time.perf_counter()
    with user_errors():
        if flower:
            result = simulate_with_flower(config)
        else:
            from client_runtime.device import Device

            result = simulate(config, Device.open(config.device or None))
    result["method"] = "federated icarl"
    result["seconds"] = time.perf_counter() - start
    result["baselines"] = {}
    for entry in result["history"]:
        tasks_of = " ".join(str(c["task"]) for c in entry["clients"])
        accs = " ".join(f"{a:.0%}" for a in entry["accuracy_per_task"])
        console.print(f"  round {entry['round']:3d}: client tasks {tasks_of} | head "
                      f"{entry['global_classes']} classes | accuracy per task {accs}")  # fmt: skip
    result["exemplars"] = sum(c["exemplars"] for c in result["history"][-1]["clients"])
    _print(result)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
        console.print(f"results written to {json_path}")
    if plot:
        from mgfl.continual_plot import plot_incremental

        plot_incremental(result, plot, f"{config.model} on {config.dataset}, "
                         f"{config.num_clients} clients")  # fmt: skip
        console.print(f"plot written to {plot}")


def _print(result: dict) -> None:
    matrix = Table(title=f"accuracy matrix R[i][j] ({result['method']}, head)")
    matrix.add_column("after task")
    for j in range(len(result["accuracy_matrix"])):
        matrix.add_column(f"task {j}", justify="right")
    for i, row in enumerate(result["accuracy_matrix"]):
        matrix.add_row(str(i), *("" if a is None else f"{a:.1%}" for a in row))
    console.print(matrix)
    summary = Table(title="class-incremental metrics")
    for column in ("method", "final acc.", "avg. incr. acc.", "forgetting", "BWT", "exemplars",
                   "time"):  # fmt: skip
        summary.add_column(column, justify="right")
    runs = {result["method"]: result, **result["baselines"]}
    for name, run in runs.items():
        summary.add_row(
            name,
            f"{run['final_accuracy']:.1%}",
            f"{run['average_incremental_accuracy']:.1%}",
            f"{run['forgetting']:.1%}",
            f"{run['backward_transfer']:+.1%}",
            f"{run['exemplars']} ({_mib(run['exemplar_bytes'])})",
            f"{run['seconds']:.0f} s",
        )
    console.print(summary)
    if "final_accuracy_nme" in result:
        console.print(f"final accuracy by nearest mean of exemplars: "
                      f"{result['final_accuracy_nme']:.1%}")  # fmt: skip
