"""Fault injection for simulation: a Grid that makes a seeded share of the training replies of
every round fail the way real devices fail.

- **crash**: the client never trains; the round receives Flower's error reply for a ClientApp that
  crashed (what a SuperNode whose app died sends back).
- **timeout**: the client trains but its reply never arrives within the round.
- **late**: the reply arrives after the round closed; the round must not use it.

The choice is a pure function of ``(seed, round)``, so a run, and a resumed run, injects the same
faults. Evaluation messages are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.app import Error, Message
from flwr.app.message_type import MessageType
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore import log

FAULT_KINDS = ("crash", "timeout", "late")


@dataclass(frozen=True)
class FaultPlan:
    """Shares of the training replies of each round that crash, time out or come late."""

    crash: float = 0.0
    timeout: float = 0.0
    late: float = 0.0
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.crash + self.timeout + self.late > 0

    def assign(self, server_round: int, count: int) -> list[str]:
        """The fate of each of ``count`` messages: "" (none) or one of :data:`FAULT_KINDS`.
        Each kind hits ``round(share * count)`` messages, chosen at random without overlap."""
        rng = np.random.default_rng([self.seed, server_round])
        order = rng.permutation(count)
        fates = [""] * count
        start = 0
        for kind, share in zip(FAULT_KINDS, (self.crash, self.timeout, self.late), strict=True):
            hit = min(count - start, int(round(share * count)))
            for index in order[start:start + hit]:
                fates[int(index)] = kind
            start += hit
        return fates


def _round_of(message: Message) -> int:
    config = message.content.config_records.get("config")
    return int(config["server-round"]) if config and "server-round" in config else 0


class FaultyGrid:
    """Wraps a Grid; ``injected[round]`` counts what was done to that round's replies."""

    def __init__(self, grid: Grid, plan: FaultPlan):
        self.grid = grid
        self.plan = plan
        self.injected: dict[int, dict[str, int]] = {}

    def __getattr__(self, name: str):
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        messages = list(messages)
        training = [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        if not training or not self.plan.active:
            return self.grid.send_and_receive(messages, timeout=timeout)
        server_round = _round_of(training[0])
        fates = dict(zip((id(m) for m in training),
                         self.plan.assign(server_round, len(training)), strict=True))
        counts = dict.fromkeys(FAULT_KINDS, 0)
        sent = [m for m in messages if fates.get(id(m)) != "crash"]
        crashed = [m for m in messages if fates.get(id(m)) == "crash"]
        dropped = {m.metadata.dst_node_id: fates[id(m)] for m in training
                   if fates[id(m)] in ("timeout", "late")}
        replies: list[Message] = []
        for reply in self.grid.send_and_receive(sent, timeout=timeout):
            fate = dropped.get(reply.metadata.src_node_id)
            if fate:
                counts[fate] += 1
                log(WARNING, "round %d: reply of node %d %s (injected fault)", server_round,
                    reply.metadata.src_node_id,
                    "timed out" if fate == "timeout" else "came after the round closed")
                continue
            replies.append(reply)
        for message in crashed:
            counts["crash"] += 1
            replies.append(Message(Error(ErrorCode.CLIENT_APP_CRASHED,
                                         "injected fault: the ClientApp crashed"),
                                   reply_to=message))
        self.injected[server_round] = counts
        return replies
