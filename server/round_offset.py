"""Continuing a run after round N: Flower's ``Strategy.start`` always counts rounds from 1, so
this strategy shifts every round number it passes on by N. Round numbers seed client training,
top-k rounding and fault injection, so the continued rounds are the rounds N+1... of the original
run, not a new round 1."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy


class ContinuedStrategy(Strategy):
    """Delegates to ``inner`` with every round number increased by ``offset``."""

    def __init__(self, inner: Strategy, offset: int):
        self.inner = inner
        self.offset = offset

    def summary(self) -> None:
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.inner.configure_train(server_round + self.offset, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.inner.aggregate_train(server_round + self.offset, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round + self.offset, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round + self.offset, replies)

    def evaluate_fn(self, evaluate: Callable[[int, ArrayRecord], MetricRecord | None]
                    ) -> Callable[[int, ArrayRecord], MetricRecord | None]:
        """``evaluate`` with shifted rounds; the start-up evaluation of the restored model is
        skipped when continuing (that round was evaluated and recorded before)."""

        def shifted(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0 and self.offset > 0:
                return None
            return evaluate(server_round + self.offset, arrays)

        return shifted
