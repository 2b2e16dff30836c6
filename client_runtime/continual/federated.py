"""One client round of federated class-incremental learning.

The client receives the global model (its head has a row per class any client has met so far),
works out from the schedule which task it is on, and:

1. when it has moved past a task since its last round, chooses that task's exemplars on the
   received model's features and adds them to its memory (rebalanced); the memory lives in the
   client's ``Context.state`` and is never put in a reply;
2. trains on its data of the current task plus its exemplars, with distillation from the
   received model's logits on the classes of earlier tasks (computed on the device);
3. replies with the whole model, its head cut or grown to the classes it knows, the number of
   samples it trained on and that class count, which the server needs to merge heads.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict

from client_runtime.continual.head import grow_head, head_path, with_classes
from client_runtime.continual.learner import (
    IncrementalConfig,
    choose_exemplars,
    eval_step,
    train_increment,
)
from client_runtime.continual.memory import ExemplarMemory, MemoryBudget
from client_runtime.continual.storage import StoredSamples
from client_runtime.device import Device
from mgfl import continual_federation as cf
from mgfl.models.model import Model


def learner_config(config: cf.FederatedIncrementalConfig) -> IncrementalConfig:
    return IncrementalConfig(
        memory=config.memory,
        exemplar_dtype=config.exemplar_dtype,
        selection=config.selection,
        epochs=config.epochs,
        batch=config.batch,
        lr=config.lr,
        eval_batch=config.eval_batch,
        seed=config.seed,
    )


def _load_memory(context: Context, memory: ExemplarMemory) -> int:
    """Restore the exemplars kept in this client's state; returns the tasks they cover."""
    meta = context.state.get(cf.CLIENT_STATE_META)
    if meta is None:
        return 0
    arrays = context.state[cf.CLIENT_STATE_EXEMPLARS]
    stored = {}
    for label in meta["classes"]:
        scales = arrays.get(f"{label}:scales")
        stored[int(label)] = StoredSamples(
            memory.dtype,
            arrays[f"{label}:data"].numpy(),
            None if scales is None else scales.numpy(),
        )
    memory.load(stored)
    return int(meta["tasks-done"])


def _save_memory(context: Context, memory: ExemplarMemory, tasks_done: int) -> None:
    arrays = {}
    for label, samples in memory.stored().items():
        arrays[f"{label}:data"] = Array(samples.data)
        if samples.scales is not None:
            arrays[f"{label}:scales"] = Array(samples.scales)
    context.state[cf.CLIENT_STATE_EXEMPLARS] = ArrayRecord(arrays)
    context.state[cf.CLIENT_STATE_META] = ConfigRecord(
        {"tasks-done": tasks_done, "classes": [int(c) for c in memory.classes]}
    )


def _with_head(model: Model, state: dict, classes: int, seed: int) -> tuple[Model, dict]:
    """The received model with exactly ``classes`` head rows (cut, or grown with new rows)."""
    have = model.num_classes
    if classes >= have:
        return grow_head(model, state, classes, seed)
    path = head_path(model)
    cut = dict(state)
    for suffix in ("weight", "bias"):
        if f"{path}.{suffix}" in cut:
            cut[f"{path}.{suffix}"] = state[f"{path}.{suffix}"][:classes]
    return with_classes(model, classes), cut


def client_round(
    content: RecordDict,
    context: Context,
    device: Device,
    base_model: Model,
    x: np.ndarray,
    y: np.ndarray,
    config: cf.FederatedIncrementalConfig,
    client: int,
) -> RecordDict:
    """Train this client for the round in ``content``; ``x, y`` are all of its samples (it only
    reads those of its current task, and of a task it just finished, to pick exemplars)."""
    server_round = int(content[cf.ROUND_KEY]["round"])
    received = {k: v.numpy() for k, v in content[cf.GLOBAL_KEY].items()}
    tasks = config.task_labels()
    task = config.task_of(client, server_round)
    lconfig = learner_config(config)
    global_classes = received[f"{head_path(base_model)}.weight"].shape[0]
    global_model = with_classes(base_model, global_classes)
    memory = ExemplarMemory(MemoryBudget(config.memory), config.exemplar_dtype, x.shape[1:])
    done = _load_memory(context, memory)
    while done < task:  # tasks finished since the last round: keep their exemplars
        seen = sum(len(t) for t in tasks[: done + 1])
        mask = np.isin(y, tasks[done])
        chosen, _ = choose_exemplars(
            device, *_with_head(global_model, received, seen, config.seed), x[mask], y[mask],
            tasks[done], memory.quota(seen), lconfig,
        )  # fmt: skip
        memory.add_classes(chosen)
        done += 1
    known = sum(len(t) for t in tasks[: task + 1])
    old = known - len(tasks[task])
    mask = np.isin(y, tasks[task])
    ex_x, ex_y = memory.samples()
    train_x, train_y = np.concatenate([x[mask], ex_x]), np.concatenate([y[mask], ex_y])
    old_logits = None
    if old > 0 and global_classes >= old:
        teacher = eval_step(device, *_with_head(global_model, received, old, 0), config.eval_batch)
        old_logits = teacher.predict(train_x)
    model, state = _with_head(global_model, received, known, config.seed + server_round)
    state, stats, peak = train_increment(
        device, model, state, train_x, train_y, lconfig, old_logits, old,
        seed=(config.seed, client, server_round),
    )  # fmt: skip
    _save_memory(context, memory, done)
    reply = ArrayRecord({name: Array(np.asarray(v, np.float32)) for name, v in state.items()})
    metrics = MetricRecord(
        {
            "client": client,
            "num-examples": len(train_y),
            "classes": known,
            "task": task,
            "loss": float(stats["loss"]),
            "train-accuracy": float(stats["accuracy"]),
            "exemplars": len(memory),
            "exemplar-bytes": memory.nbytes,
            "peak-device-bytes": peak,
        }
    )
    return RecordDict({cf.REPLY_KEY: reply, cf.METRICS_KEY: metrics})
