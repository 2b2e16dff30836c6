"""Over-selection and the round deadline: Flower's sampler draws the over-selected count, the
wrapper aggregates only the first replies to finish by simulated time, and the clock adds up."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from mgfl.codecs import encode_update, get_codec
from mgfl.flower_records import bundle_record
from mgfl.models.zoo import build_model
from mgfl.simulated_phone import FLEET_PROFILES, PROFILE_KEY, TRAIN_KEY, UPLINK_KEY
from mgfl.update_layout import UpdateLayout
from server.compressed import CompressedUpdateStrategy, record_of, state_of
from server.stragglers import FleetRounds, client_time, needed_nodes, selected_nodes
from tests.server.conftest import FakeGrid, on_grid

MODEL = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(8,))
LAYOUT = UpdateLayout.of(MODEL, set(MODEL.parameter_shapes()))


def test_counts_follow_flowers_sampling_rule():
    assert needed_nodes(10, 0.5, 2) == 5
    assert needed_nodes(10, 0.1, 2) == 2  # the minimum wins
    assert needed_nodes(3, 1.0, 5) == 3  # never more than are connected
    assert selected_nodes(5, 0.3, 10) == 7  # ceil(6.5)
    assert selected_nodes(4, 0.5, 10) == 6
    assert selected_nodes(10, 0.3, 10) == 10  # bounded by the connected nodes
    assert selected_nodes(4, 0.0, 10) == 4


def test_flowers_sampler_draws_the_over_selected_count(flower_identity, rng):
    for nodes, fraction, over, expected in ((8, 0.5, 0.5, 6), (10, 0.3, 0.3, 4), (7, 1.0, 0.5, 7),
                                            (20, 0.35, 0.0, 7)):
        fleet = FleetRounds(fraction, 2, over)
        strategy = CompressedUpdateStrategy(FedAvg(fraction_train=fraction, min_train_nodes=2),
                                            LAYOUT, get_codec("none"), fleet=fleet)
        messages = strategy.configure_train(1, record_of(state(rng)), ConfigRecord(),
                                            FakeGrid(nodes))
        assert len(messages) == expected, (nodes, fraction, over)
        assert len({m.metadata.dst_node_id for m in messages}) == expected
        assert fleet.needed[1] == needed_nodes(nodes, fraction, 2)


def state(rng) -> dict[str, np.ndarray]:
    return {name: on_grid(rng, shape) for name, shape in LAYOUT.shapes.items()}


def timed_reply(message: Message, weights: dict, received: dict, examples: int,
                train_s: float, uplink_s: float, profile: int = 0) -> Message:
    changes = {n: weights[n] - received[n] for n in LAYOUT.travelling}
    blob = encode_update(changes, get_codec("none")).blob
    metrics = MetricRecord({"num-examples": examples, TRAIN_KEY: train_s, UPLINK_KEY: uplink_s,
                            PROFILE_KEY: profile})
    return Message(RecordDict({"arrays": bundle_record(blob), "metrics": metrics}),
                   reply_to=message)


def run_round(rng, fleet: FleetRounds, seconds: list[tuple[float, float]], server_round: int = 1):
    """One wrapped FedAvg round on six nodes; each client's simulated (train, uplink) seconds
    as given. Returns the strategy, the model, the trained weights by node and the messages."""
    strategy = CompressedUpdateStrategy(FedAvg(fraction_train=0.5, min_train_nodes=2), LAYOUT,
                                        get_codec("none"), fleet=fleet)
    global_state = state(rng)
    messages = list(strategy.configure_train(server_round, record_of(global_state),
                                             ConfigRecord(), FakeGrid(len(seconds))))
    trained = {m.metadata.dst_node_id: state(rng) for m in messages}
    replies = [timed_reply(m, trained[m.metadata.dst_node_id], global_state, 10, *seconds[i])
               for i, m in enumerate(messages)]
    arrays, _ = strategy.aggregate_train(server_round, replies)
    return strategy, arrays, trained, messages


def fedavg_of(weights: list[dict]) -> dict[str, np.ndarray]:
    return {n: np.mean([w[n].astype(np.float64) for w in weights], axis=0)
            for n in LAYOUT.trainable}


def test_the_first_to_finish_are_aggregated_and_the_rest_dropped(flower_identity, rng):
    # six nodes, fraction 0.5: three needed; over-selection 1.0 samples all six
    seconds = [(9.0, 1.0), (2.0, 0.5), (4.0, 4.0), (1.0, 0.2), (3.0, 0.1), (6.0, 0.5)]
    fleet = FleetRounds(0.5, 2, over_selection=1.0)
    strategy, arrays, trained, messages = run_round(rng, fleet, seconds)
    assert len(messages) == 6
    node_of = [m.metadata.dst_node_id for m in messages]
    fastest = [node_of[i] for i in (3, 1, 4)]  # 1.2 s, 2.5 s, 3.1 s
    merged = state_of(arrays)
    expected = fedavg_of([trained[n] for n in fastest])
    for name in LAYOUT.trainable:
        np.testing.assert_allclose(merged[name], expected[name], atol=1e-6, err_msg=name)
    traffic = strategy.traffic[1]
    assert sorted(traffic.stragglers) == sorted(node_of[i] for i in (0, 2, 5))
    assert traffic.replies == 3 and traffic.rejected == 0
    record = fleet.records[1]
    assert record["round_s"] == pytest.approx(3.1)  # the last kept client's finish
    assert record["kept"] == fastest and record["needed"] == 3
    assert [c["kept"] for c in record["clients"]] == [True] * 3 + [False] * 3
    assert fleet.clock.seconds == pytest.approx(3.1)


def test_a_deadline_cuts_the_round_short(flower_identity, rng):
    seconds = [(9.0, 1.0), (2.0, 0.5), (4.0, 4.0), (1.0, 0.2), (30.0, 0.1), (6.0, 0.5)]
    fleet = FleetRounds(0.5, 2, over_selection=1.0, deadline_s=3.0)
    strategy, arrays, trained, messages = run_round(rng, fleet, seconds)
    node_of = [m.metadata.dst_node_id for m in messages]
    merged = state_of(arrays)
    expected = fedavg_of([trained[node_of[i]] for i in (3, 1)])  # only two made it
    for name in LAYOUT.trainable:
        np.testing.assert_allclose(merged[name], expected[name], atol=1e-6, err_msg=name)
    assert len(strategy.traffic[1].stragglers) == 4
    assert fleet.records[1]["round_s"] == pytest.approx(3.0)  # waited until the deadline


def test_the_clock_adds_rounds_and_resumes_from_a_start(flower_identity, rng):
    seconds = [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)]
    fleet = FleetRounds(0.5, 2, over_selection=0.0, start_s=100.0)
    for server_round in (1, 2):
        run_round(rng, fleet, seconds, server_round)
    walls = [fleet.records[r]["wall_clock_s"] for r in (1, 2)]
    rounds = [fleet.records[r]["round_s"] for r in (1, 2)]
    assert walls[0] == pytest.approx(100.0 + rounds[0])
    assert walls[1] == pytest.approx(walls[0] + rounds[1])
    assert all(s == [] for s in (fleet.records[r]["stragglers"] for r in (1, 2)))


def test_replies_without_timing_are_rejected_and_errors_pass_through(flower_identity, rng):
    fleet = FleetRounds(1.0, 1)
    strategy = CompressedUpdateStrategy(FedAvg(min_train_nodes=1), LAYOUT, get_codec("none"),
                                        fleet=fleet)
    global_state = state(rng)
    messages = list(strategy.configure_train(1, record_of(global_state), ConfigRecord(),
                                             FakeGrid(3)))
    good = timed_reply(messages[0], state(rng), global_state, 10, 1.0, 1.0)
    untimed = Message(RecordDict({"arrays": good.content["arrays"],
                                  "metrics": MetricRecord({"num-examples": 5})}),
                      reply_to=messages[1])
    failed = Message(Error(code=0, reason="crashed"), reply_to=messages[2])
    arrays, _ = strategy.aggregate_train(1, [good, untimed, failed])
    assert arrays is not None
    traffic = strategy.traffic[1]
    assert (traffic.replies, traffic.rejected, traffic.failed) == (2, 1, 1)
    assert "sim-train-s" in traffic.rejections[0]["reason"]
    assert traffic.stragglers == []


@pytest.mark.parametrize("metrics, why", [
    ({TRAIN_KEY: -1.0, UPLINK_KEY: 1.0, PROFILE_KEY: 0}, "non-negative"),
    ({TRAIN_KEY: float("nan"), UPLINK_KEY: 1.0, PROFILE_KEY: 0}, "non-negative"),
    ({TRAIN_KEY: 1.0, UPLINK_KEY: 1.0, PROFILE_KEY: len(FLEET_PROFILES)}, "profile table"),
    ({TRAIN_KEY: 1.0, PROFILE_KEY: 0}, UPLINK_KEY),
])
def test_bad_timing_metrics_are_named(flower_identity, metrics, why):
    reply = Message(RecordDict({"metrics": MetricRecord({"num-examples": 1, **metrics})}),
                    dst_node_id=0, message_type="train")
    with pytest.raises(ValueError, match=why):
        client_time(3, reply)


def test_timing_of_a_reply(flower_identity):
    metrics = {TRAIN_KEY: 2.5, UPLINK_KEY: 0.5, PROFILE_KEY: FLEET_PROFILES.index("mali-g78")}
    reply = Message(RecordDict({"metrics": MetricRecord({"num-examples": 1, **metrics})}),
                    dst_node_id=0, message_type="train")
    time = client_time(3, reply)
    assert (time.client, time.profile, time.total_s) == (3, "mali-g78", 3.0)
