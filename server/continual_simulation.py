"""Federated class-incremental learning in simulation: the clients' rounds run in this process,
each client with its own Flower ``Context`` whose state (the exemplar memory) persists across
rounds, exactly as Flower keeps ``Context.state`` per node within a run. The server evaluates
the global model on the held-out samples of every task after each round."""

from __future__ import annotations

import numpy as np
from flwr.app import Context, RecordDict

from mgfl import continual_federation as cf
from mgfl import continual_metrics


def client_shares(config: cf.FederatedIncrementalConfig, labels, groups) -> list[np.ndarray]:
    from mgfl.data.partition import partition

    return partition(
        labels, groups, scheme="iid", num_clients=config.num_clients, seed=config.partition_seed
    )


def simulate(config: cf.FederatedIncrementalConfig, device, dataset=None, progress=None) -> dict:
    """Run every round; returns the history, the accuracy matrix per task switch and metrics."""
    from client_runtime.continual.federated import client_round
    from client_runtime.continual.head import head_path, with_classes
    from client_runtime.continual.learner import eval_step
    from mgfl.data.registry import load_dataset
    from mgfl.models.zoo import build_model
    from server.continual import run_rounds

    dataset = dataset or load_dataset(config.dataset)
    tasks = config.task_labels()
    base = build_model(config.model, input_shape=dataset.input_shape,
                       num_classes=len(tasks[0]))  # fmt: skip
    head = head_path(base)
    shares = client_shares(config, dataset.y_train, dataset.groups_train)
    contexts = [
        Context(run_id=0, node_id=k, node_config={"partition-id": k}, state=RecordDict(),
                run_config=config.to_mapping())
        for k in range(config.num_clients)
    ]  # fmt: skip

    def send(messages: list[RecordDict]) -> list[RecordDict]:
        return [
            client_round(message, contexts[k], device, base, dataset.x_train[shares[k]],
                         dataset.y_train[shares[k]], config, k)
            for k, message in enumerate(messages)
        ]  # fmt: skip

    def evaluate(state: dict, server_round: int) -> dict:
        classes = state[f"{head}.weight"].shape[0]
        model = with_classes(base, classes)
        seen = [t for t in tasks if max(t) < classes]
        mask = np.isin(dataset.y_test, sum(seen, []))
        x, y = dataset.x_test[mask], dataset.y_test[mask]
        predicted = eval_step(device, model, state, config.eval_batch).predict(x).argmax(axis=1)
        per_task = [float(np.mean(predicted[np.isin(y, t)] == y[np.isin(y, t)])) for t in seen]
        if progress:
            progress(server_round, per_task)
        return {"accuracy_per_task": per_task, "accuracy": float(np.mean(predicted == y))}

    state = base.init_state(config.seed)
    _, history = run_rounds(config, state, head, send, evaluate)
    # R[i][j]: after the last round of task i (when every client has finished it)
    ends = [min(config.num_rounds, (i + 1) * config.rounds_per_task + config.stagger)
            for i in range(len(tasks))]  # fmt: skip
    rows = []
    for i, end in enumerate(ends):
        per_task = history[end - 1]["accuracy_per_task"][: i + 1]
        rows.append(per_task + [float("nan")] * (len(tasks) - len(per_task)))
    result = continual_metrics.summarize(rows)
    last = history[-1]["clients"]
    result.update(
        config=config.to_mapping(),
        history=history,
        exemplar_bytes=int(sum(c["exemplar-bytes"] for c in last)),
        exemplar_bytes_per_client=[int(c["exemplar-bytes"]) for c in last],
    )
    return result
