"""Fault injection: seeded shares of training replies crash, time out or come late, and the
wrapped strategy aggregates the rest, down to its minimum."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from mgfl.codecs import encode_update, get_codec
from mgfl.flower_records import bundle_record
from mgfl.models.zoo import build_model
from mgfl.update_layout import UpdateLayout
from server.compressed import CompressedUpdateStrategy, record_of
from server.faults import FaultPlan, FaultyGrid

MODEL = build_model("mlp", input_shape=(1, 4, 4), num_classes=3)
LAYOUT = UpdateLayout.of(MODEL, set(MODEL.parameter_shapes()))


class AnsweringGrid:
    """Nodes that all answer every message with a small valid update."""

    def __init__(self, nodes: int):
        self.nodes = list(range(1, nodes + 1))
        self.delivered: list[int] = []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        blob = encode_update({n: np.full(LAYOUT.shapes[n], 0.25, np.float32)
                              for n in LAYOUT.travelling}, get_codec("none")).blob
        replies = []
        for message in messages:
            self.delivered.append(int(message.metadata.dst_node_id))
            replies.append(Message(RecordDict({"arrays": bundle_record(blob),
                                               "metrics": MetricRecord({"num-examples": 5})}),
                                   reply_to=message))
        return replies


@pytest.mark.parametrize("count", [1, 4, 10, 33])
def test_each_kind_hits_its_share_without_overlap(count):
    plan = FaultPlan(crash=0.2, timeout=0.3, late=0.1, seed=4)
    fates = plan.assign(7, count)
    for kind, share in (("crash", 0.2), ("timeout", 0.3), ("late", 0.1)):
        assert fates.count(kind) == min(round(share * count), count)
    assert fates == plan.assign(7, count), "a round's faults are a function of seed and round"


def test_different_rounds_hit_different_clients():
    plan = FaultPlan(crash=0.5, seed=1)
    assert len({tuple(plan.assign(r, 20)) for r in range(1, 6)}) > 1


def train_round(strategy, grid, server_round=1):
    state = {n: np.zeros(s, np.float32) for n, s in LAYOUT.shapes.items()}
    config = ConfigRecord()
    messages = list(strategy.configure_train(server_round, record_of(state), config, grid))
    return strategy.aggregate_train(server_round, grid.send_and_receive(messages, timeout=5))


def test_rounds_go_on_with_the_remaining_clients(flower_identity):
    inner = AnsweringGrid(10)
    grid = FaultyGrid(inner, FaultPlan(crash=0.2, timeout=0.2, late=0.2, seed=3))
    strategy = CompressedUpdateStrategy(FedAvg(), LAYOUT, get_codec("none"), min_replies=4)
    arrays, _ = train_round(strategy, grid)
    assert grid.injected[1] == {"crash": 2, "timeout": 2, "late": 2}
    assert len(inner.delivered) == 8, "crashed clients never got to train"
    traffic = strategy.traffic[1]
    assert (traffic.failed, traffic.replies, traffic.rejected) == (2, 4, 0)
    assert arrays is not None and traffic.aggregated


def test_below_the_minimum_the_round_keeps_the_model_and_says_so(flower_identity):
    grid = FaultyGrid(AnsweringGrid(10), FaultPlan(crash=0.4, timeout=0.3, seed=3))
    strategy = CompressedUpdateStrategy(FedAvg(), LAYOUT, get_codec("none"), min_replies=4)
    arrays, _ = train_round(strategy, grid)
    assert arrays is None
    assert not strategy.traffic[1].aggregated
    assert "3 usable replies, fewer than min-replies 4" in strategy.traffic[1].note


def test_evaluation_messages_are_left_alone(flower_identity):
    inner = AnsweringGrid(6)
    grid = FaultyGrid(inner, FaultPlan(crash=1.0))
    strategy = CompressedUpdateStrategy(FedAvg(fraction_evaluate=1.0), LAYOUT,
                                        get_codec("none"))
    state = {n: np.zeros(s, np.float32) for n, s in LAYOUT.shapes.items()}
    messages = list(strategy.configure_evaluate(1, record_of(state), ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages, timeout=5))
    assert len(replies) == 6 and not any(r.has_error() for r in replies)
    assert grid.injected == {}
