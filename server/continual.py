"""The server of federated class-incremental learning: merges replies whose heads differ in size
(the head grows as clients meet new classes) and drives the rounds.

Merging: every array below the head is the sample-weighted mean of all replies. Head row ``c``
is the weighted mean over the replies whose clients know class ``c``; a row no client sent this
round keeps its global value. The global head has as many rows as the most-advanced client.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from mgfl import continual_federation as cf

Send = Callable[[list[RecordDict]], list[RecordDict]]  # one message per client, replies in order


def merge_growing_head(
    global_state: dict[str, np.ndarray],
    head: str,
    replies: list[tuple[dict[str, np.ndarray], int, int]],
) -> dict[str, np.ndarray]:
    """``replies``: (state, samples, classes known). Returns the new global state."""
    if not replies:
        return dict(global_state)
    weights = np.array([samples for _, samples, _ in replies], np.float64)
    head_names = {f"{head}.weight", f"{head}.bias"}
    merged = {}
    for name in global_state:
        if name in head_names:
            continue
        stacked = np.stack([state[name].astype(np.float64) for state, _, _ in replies])
        merged[name] = np.tensordot(weights / weights.sum(), stacked, axes=1).astype(np.float32)
    rows = max([global_state[f"{head}.weight"].shape[0], *(c for _, _, c in replies)])
    for name in head_names & set(global_state):
        old = global_state[name]
        out = np.zeros((rows, *old.shape[1:]), np.float32)
        out[: len(old)] = old
        for row in range(rows):
            sent = [(s[name][row], w) for (s, _, c), w in zip(replies, weights, strict=True)
                    if c > row]  # fmt: skip
            if sent:
                total = sum(w for _, w in sent)
                out[row] = sum(v.astype(np.float64) * w for v, w in sent) / total
        merged[name] = out
    return merged


def round_message(
    state: dict[str, np.ndarray], server_round: int, config: cf.FederatedIncrementalConfig
) -> RecordDict:
    """The global model, the round, and the run's settings (clients need no configuration of
    their own beyond their partition)."""
    return RecordDict(
        {
            cf.GLOBAL_KEY: ArrayRecord({k: Array(np.asarray(v)) for k, v in state.items()}),
            cf.ROUND_KEY: ConfigRecord({"round": server_round}),
            cf.CONFIG_KEY: ConfigRecord(config.to_mapping()),
        }
    )


def run_rounds(
    config: cf.FederatedIncrementalConfig,
    initial_state: dict[str, np.ndarray],
    head: str,
    send: Send,
    evaluate: Callable[[dict[str, np.ndarray], int], dict] | None = None,
) -> tuple[dict[str, np.ndarray], list[dict]]:
    """All rounds of the run; returns the final global state and a history entry per round."""
    state = dict(initial_state)
    history = []
    for server_round in range(1, config.num_rounds + 1):
        replies = send([round_message(state, server_round, config)] * config.num_clients)
        parsed = []
        metrics = []
        for reply in replies:
            m = reply[cf.METRICS_KEY]
            arrays = {k: v.numpy() for k, v in reply[cf.REPLY_KEY].items()}
            if set(reply.keys()) - {cf.REPLY_KEY, cf.METRICS_KEY}:
                raise ValueError("a client reply carries more than its model and metrics")
            parsed.append((arrays, int(m["num-examples"]), int(m["classes"])))
            metrics.append(dict(m))
        state = merge_growing_head(state, head, parsed)
        entry = {"round": server_round, "clients": metrics,
                 "global_classes": int(state[f"{head}.weight"].shape[0])}  # fmt: skip
        if evaluate is not None:
            entry.update(evaluate(state, server_round))
        history.append(entry)
    return state, history
