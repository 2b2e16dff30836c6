"""A Flower strategy wrapped so that updates travel encoded and only the trained part of the
model travels, while the global model stays whole.

Round by round:

1. ``configure_train``: the wrapped strategy samples the nodes and builds its messages from the
   trainable arrays of the global model (so FedAdam and FedAvgM track exactly those); the wrapper
   then swaps the message's arrays for one encoded bundle of the travelling arrays (trainable
   parameters and BatchNorm statistics) in the downlink codec.
2. Clients reply with a bundle of *changes* (trained minus received), in the uplink codec.
3. ``aggregate_train``: each reply is decoded and checked (names, shapes, finite values); a reply
   that fails is logged and left out, never half-used. The wrapped strategy then aggregates
   ``global + change`` of the trainable arrays, as if clients had sent whole weights. BatchNorm
   statistics are averaged by sample count whatever the strategy (a server-side Adam step or a
   median of running variances has no meaning). The result is merged into the full global model:
   frozen arrays are kept, never dropped.

The byte counts of every round are the lengths of the bundles actually put into and taken out of
the messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy
from flwr.supercore import log

from mgfl.codecs import Codec, CodecError, encode_update
from mgfl.flower_records import bundle_of, bundle_record
from mgfl.update_layout import UpdateLayout
from server.stragglers import FleetRounds
from server.validation import (
    ReplyLimits,
    ReplyRejected,
    non_finite_arrays,
    validate_update,
    validate_weight,
)


@dataclass
class RoundTraffic:
    """Bytes of one round, measured on the encoded bundles."""

    downlink_bytes: int = 0
    uplink_bytes: int = 0
    replies: int = 0
    rejected: int = 0
    failed: int = 0
    evaluate_downlink_bytes: int = 0
    rejections: list[dict] = field(default_factory=list)  # {"node": id, "reason": text}
    aggregated: bool = True  # False: the round kept the previous global model
    note: str = ""  # why it did, if it did
    stragglers: list[int] = field(default_factory=list)  # nodes that finished too late
    statistics_replies: int = 0  # accepted replies carrying BatchNorm statistics


def state_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def record_of(state: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.asarray(value)) for name, value in state.items()})


class CompressedUpdateStrategy(Strategy):
    """Decoding, checking and partial-model merging around any of Flower's strategies."""

    def __init__(self, inner: FedAvg, layout: UpdateLayout, downlink_codec: Codec,
                 extra_config: dict[str, str] | None = None, limits: ReplyLimits | None = None,
                 min_replies: int = 1, fleet: FleetRounds | None = None):
        self.inner = inner
        self.fleet = fleet
        self.limits = limits or ReplyLimits.for_layout(layout)
        self.min_replies = min_replies
        self.layout = layout
        self.downlink_codec = downlink_codec
        self.extra_config = dict(extra_config or {})
        self.traffic: dict[int, RoundTraffic] = {}
        self.client_metrics: dict[int, dict[str, float]] = {}
        self._global: dict[str, np.ndarray] = {}

    # -- Strategy interface ----------------------------------------------------------------
    def summary(self) -> None:
        log(INFO, "\t├──> mgfl: %d trainable + %d buffer arrays travel, %d frozen stay; "
            "downlink codec %s", len(self.layout.trainable), len(self.layout.buffers),
            len(self.layout.frozen), self.downlink_codec.spec)
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._global = state_of(arrays)
        self._check_complete(self._global)
        for key, value in self.extra_config.items():
            config[key] = value
        trainable = record_of({n: self._global[n] for n in self.layout.trainable})
        if self.fleet is not None:
            self.fleet.select(self.inner, len(list(grid.get_node_ids())), server_round)
        messages = list(self.inner.configure_train(server_round, trainable, config, grid))
        sent = self._attach_downlink(messages)
        self.traffic[server_round] = RoundTraffic(downlink_bytes=sent)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        traffic = self.traffic.setdefault(server_round, RoundTraffic())
        if self.fleet is not None:
            replies = self._drop_stragglers(server_round, replies, traffic)
        passed: list[Message] = []
        buffer_sets: list[tuple[float, dict[str, np.ndarray]]] = []
        for reply in replies:
            if reply.has_error():
                traffic.failed += 1
                traffic.rejections.append({"node": int(reply.metadata.src_node_id),
                                           "reason": f"client failed: {reply.error.reason}"})
                passed.append(reply)  # the wrapped strategy logs it
                continue
            traffic.replies += 1
            try:
                blob = bundle_of(reply.content, self.inner.arrayrecord_key)
                traffic.uplink_bytes += len(blob)
                weights, buffers, examples, statistics = self._decode_reply(reply.content,
                                                                            blob)
            except (CodecError, ValueError, KeyError) as err:
                traffic.rejected += 1
                node = int(reply.metadata.src_node_id)
                traffic.rejections.append({"node": node, "reason": str(err)})
                log(WARNING, "round %d: update of node %d rejected: %s", server_round, node, err)
                continue
            reply.content = RecordDict({
                self.inner.arrayrecord_key: record_of(weights),
                "metrics": self._single_metrics(reply.content),
            })
            passed.append(reply)
            buffer_sets.append((examples, buffers))
            traffic.statistics_replies += statistics
        if len(buffer_sets) < self.min_replies:
            return self._keep_global(server_round, traffic, f"{len(buffer_sets)} usable replies, "
                                     f"fewer than min-replies {self.min_replies}")
        aggregated, metrics = self.inner.aggregate_train(server_round, passed)
        if metrics is not None:
            self.client_metrics[server_round] = {k: v for k, v in metrics.items()
                                                 if isinstance(v, (int, float))}
        if aggregated is None:
            return None, metrics
        merged = dict(self._global)
        merged.update({name: np.asarray(array.numpy(), np.float32)
                       for name, array in aggregated.items()})
        merged.update(_weighted_mean(buffer_sets, self.layout.buffers))
        self._check_complete(merged)
        broken = non_finite_arrays(merged, self._global)
        if broken:
            self._keep_global(server_round, traffic, f"the aggregate of {broken[:3]} is not finite")
            return None, metrics
        return record_of(merged), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        state = state_of(arrays)
        for key, value in self.extra_config.items():
            config[key] = value
        trainable = record_of({n: state[n] for n in self.layout.trainable})
        messages = list(self.inner.configure_evaluate(server_round, trainable, config, grid))
        sent = self._attach_downlink(messages, state)
        self.traffic.setdefault(server_round, RoundTraffic()).evaluate_downlink_bytes = sent
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    # -- helpers -----------------------------------------------------------------------------
    def _drop_stragglers(self, server_round: int, replies: Iterable[Message],
                         traffic: RoundTraffic) -> list[Message]:
        """The replies of the first clients to finish by simulated time; replies without usable
        timing are rejected, the late ones are counted as stragglers and not aggregated."""
        sorted_out = self.fleet.sort_out(server_round, replies)
        for reply, why in sorted_out.unreadable:
            node = int(reply.metadata.src_node_id)
            traffic.replies += 1
            traffic.rejected += 1
            traffic.rejections.append({"node": node, "reason": why})
            log(WARNING, "round %d: update of node %d rejected: %s", server_round, node, why)
        traffic.stragglers = [int(r.metadata.src_node_id) for r in sorted_out.stragglers]
        if traffic.stragglers:
            log(INFO, "round %d: %d straggler(s) dropped, simulated round %.1f s",
                server_round, len(traffic.stragglers), sorted_out.record["round_s"])
        return sorted_out.kept

    def _attach_downlink(self, messages: list[Message],
                         state: dict[str, np.ndarray] | None = None) -> int:
        """Puts one encoded bundle of the travelling arrays into every message; returns the
        bytes sent in total."""
        if not messages:
            return 0
        state = self._global if state is None else state
        travelling = {name: state[name] for name in self.layout.travelling}
        record = bundle_record(encode_update(travelling, self.downlink_codec).blob)
        blob_bytes = len(record["update"].data)
        for message in messages:
            message.content[self.inner.arrayrecord_key] = record
        return blob_bytes * len(messages)

    def _keep_global(self, server_round: int, traffic: RoundTraffic, why: str
                     ) -> tuple[None, None]:
        """The round ends without changing the global model, and says so."""
        traffic.aggregated = False
        traffic.note = why
        log(WARNING, "round %d keeps the previous global model: %s", server_round, why)
        return None, None

    def _decode_reply(self, content: RecordDict, blob: bytes
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float, bool]:
        """The reply's weights and statistics (the global ones where it sends no change), its
        sample count, and whether it sent statistics (not in every round: statistics-every)."""
        changes = validate_update(blob, self.layout, self._global, self.limits)
        metrics = self._single_metrics(content)
        key = self.inner.weighted_by_key
        if key not in metrics:
            raise ReplyRejected(f"the reply's metrics lack {key}")
        examples = validate_weight(metrics[key], key)

        def rebuilt(name: str) -> np.ndarray:
            base = self._global[name]
            return base + changes[name] if name in changes else base.copy()

        weights = {name: rebuilt(name) for name in self.layout.trainable}
        buffers = {name: rebuilt(name) for name in self.layout.buffers}
        overflowing = non_finite_arrays({**weights, **buffers}, self._global)
        if overflowing:
            raise ReplyRejected(f"global + change of {overflowing[:3]} overflows float32")
        return weights, buffers, examples, any(n in changes for n in self.layout.buffers)

    def _single_metrics(self, content: RecordDict) -> MetricRecord:
        records = list(content.metric_records.values())
        if len(records) != 1:
            raise ValueError(f"expected one MetricRecord in the reply, found {len(records)}")
        return records[0]

    def _check_complete(self, state: dict[str, np.ndarray]) -> None:
        missing = [n for n in self.layout.shapes if n not in state]
        if missing:
            raise ValueError(f"the global model lacks {missing[:5]}: it must hold every array")


def _weighted_mean(sets: list[tuple[float, dict[str, np.ndarray]]], names: tuple[str, ...]
                   ) -> dict[str, np.ndarray]:
    if not sets:
        return {}
    total = sum(weight for weight, _ in sets)
    return {
        name: (sum(weight * values[name].astype(np.float64) for weight, values in sets)
               / total).astype(np.float32)
        for name in names
    }
