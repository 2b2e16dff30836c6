"""A class-incremental experiment: one data set split into tasks of new classes, one method run
over them, the accuracy matrix measured after every task. The same split serves iCaRL and its
baselines, so their numbers compare."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np

from client_runtime.continual.learner import IncrementalConfig, IncrementalLearner, IncrementReport
from client_runtime.device import Device
from mgfl import continual_metrics
from mgfl.data.dataset import Dataset
from mgfl.models.model import Model

TaskCallback = Callable[[str, IncrementReport, list[float]], None]


def class_tasks(num_classes: int, tasks: int, classes_per_task: int | None) -> list[list[int]]:
    """Labels of each task in order: ``classes_per_task`` new ones each (default: all classes
    split evenly)."""
    per_task = classes_per_task or num_classes // tasks
    if tasks < 1 or per_task < 1 or tasks * per_task > num_classes:
        raise ValueError(
            f"{tasks} tasks of {per_task} classes need {tasks * per_task} classes; the data set "
            f"has {num_classes}"
        )
    return [list(range(t * per_task, (t + 1) * per_task)) for t in range(tasks)]


def run_method(
    device: Device,
    model: Model,
    dataset: Dataset,
    tasks: list[list[int]],
    config: IncrementalConfig,
    on_task: TaskCallback | None = None,
) -> dict:
    """Train task after task; returns the metrics, the matrix and each increment's report."""
    learner = IncrementalLearner(device, model, config)
    rows: list[list[float]] = []
    start = time.perf_counter()
    for index, labels in enumerate(tasks):
        mask = np.isin(dataset.y_train, labels)
        report = learner.learn(dataset.x_train[mask], dataset.y_train[mask])
        seen = tasks[: index + 1]
        test = np.isin(dataset.y_test, sum(seen, []))
        row = learner.accuracy_per_task(dataset.x_test[test], dataset.y_test[test], seen)
        rows.append(row + [float("nan")] * (len(tasks) - len(row)))
        if on_task:
            on_task(config.method, report, row)
    sizes = [int(np.isin(dataset.y_test, labels).sum()) for labels in tasks]
    result = continual_metrics.summarize(rows, task_sizes=sizes)
    result.update(
        method=config.method,
        exemplar_bytes=learner.memory.nbytes,
        exemplars=len(learner.memory),
        seconds=time.perf_counter() - start,
        increments=[r.to_dict() for r in learner.reports],
    )
    if config.method == "icarl":
        nme = learner.accuracy_per_task(dataset.x_test, dataset.y_test, tasks, classifier="nme")
        result["final_accuracy_nme"] = float(np.average(nme, weights=sizes))
    return result


def run_experiment(
    device: Device,
    model: Model,
    dataset: Dataset,
    tasks: list[list[int]],
    config: IncrementalConfig,
    baselines: bool = True,
    on_task: TaskCallback | None = None,
) -> dict:
    """The method of ``config`` and, with ``baselines``, fine-tuning and joint training."""
    result = run_method(device, model, dataset, tasks, config, on_task)
    result["config"] = asdict(config)
    result["tasks"] = tasks
    result["baselines"] = {}
    if baselines:
        for method in ("finetune", "joint"):
            other = replace(config, method=method, classifier="head")
            result["baselines"][method] = run_method(device, model, dataset, tasks, other, on_task)
    return result
