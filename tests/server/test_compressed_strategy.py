"""The strategy wrapper: encoded updates aggregate like plain ones, partial models are merged into
the whole, bad replies are refused, and bytes are counted from the messages."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedMedian, Krum

from mgfl.codecs import decode_update, encode_update, get_codec
from mgfl.flower_records import bundle_of, bundle_record
from mgfl.models.zoo import build_model
from mgfl.update_layout import UpdateLayout
from server.compressed import CompressedUpdateStrategy, record_of, state_of
from tests.server.conftest import on_grid

MODEL = build_model("dscnn", input_shape=(1, 16, 12), num_classes=5, channels=8)
ALL = set(MODEL.parameter_shapes())


def layout_for(trainable=None) -> UpdateLayout:
    return UpdateLayout.of(MODEL, ALL if trainable is None else trainable)


def grid_state(rng) -> dict[str, np.ndarray]:
    shapes = {**MODEL.parameter_shapes(), **MODEL.buffer_shapes()}
    return {name: on_grid(rng, shape) for name, shape in shapes.items()}


def client_replies(messages, trained: list[dict], examples: list[int], received: dict,
                   codec_spec: str, layout: UpdateLayout) -> list[Message]:
    """What clients answer: the encoded change of the travelling arrays, and their metrics."""
    replies = []
    for message, weights, count in zip(messages, trained, examples, strict=True):
        changes = {n: weights[n] - received[n] for n in layout.travelling}
        blob = encode_update(changes, get_codec(codec_spec)).blob
        content = RecordDict({"arrays": bundle_record(blob),
                              "metrics": MetricRecord({"num-examples": count, "loss": 1.0})})
        replies.append(Message(content, reply_to=message))
    return replies


def plain_replies(messages, trained: list[dict], examples: list[int], names) -> list[Message]:
    """What clients of an unwrapped Flower strategy answer: whole float32 arrays."""
    return [Message(RecordDict({"arrays": record_of({n: w[n] for n in names}),
                                "metrics": MetricRecord({"num-examples": c, "loss": 1.0})}),
                    reply_to=m)
            for m, w, c in zip(messages, trained, examples, strict=True)]


def received_state(message: Message, layout: UpdateLayout) -> dict:
    return decode_update(bundle_of(message.content), layout.travelling_shapes())


def one_round(strategy, grid, global_state, trained, examples, codec_spec):
    messages = list(strategy.configure_train(1, record_of(global_state), ConfigRecord(), grid))
    received = received_state(messages[0], strategy.layout)
    replies = client_replies(messages, trained, examples, received, codec_spec, strategy.layout)
    arrays, metrics = strategy.aggregate_train(1, replies)
    return state_of(arrays), metrics, messages


@pytest.mark.parametrize("codec_spec", ["none", "fp16", "topk:1"])
def test_lossless_encoding_aggregates_to_the_plain_fedavg_model(flower_identity, grid, rng,
                                                                 codec_spec):
    """On values every codec here carries exactly, the wrapped FedAvg must give the very model
    Flower's FedAvg gives on whole float32 arrays."""
    layout = layout_for()
    global_state = grid_state(rng)
    trained = [grid_state(rng) for _ in range(4)]
    examples = [10, 30, 20, 40]
    wrapped = CompressedUpdateStrategy(FedAvg(), layout, get_codec("none"))
    merged, _, _ = one_round(wrapped, grid, global_state, trained, examples, codec_spec)

    plain = FedAvg()
    messages = list(plain.configure_train(1, record_of(global_state), ConfigRecord(), grid))
    expected, _ = plain.aggregate_train(1, plain_replies(messages, trained, examples,
                                                         layout.trainable))
    expected = state_of(expected)
    for name in layout.trainable:
        np.testing.assert_array_equal(merged[name], expected[name], err_msg=name)


def test_uncompressed_random_updates_match_plain_fedavg(flower_identity, grid, rng):
    layout = layout_for()
    global_state = {n: rng.normal(size=s).astype(np.float32)
                    for n, s in layout.shapes.items()}
    trained = [{n: v + 0.01 * rng.normal(size=v.shape).astype(np.float32)
                for n, v in global_state.items()} for _ in range(4)]
    examples = [5, 7, 9, 11]
    wrapped = CompressedUpdateStrategy(FedAvg(), layout, get_codec("none"))
    merged, _, _ = one_round(wrapped, grid, global_state, trained, examples, "none")
    weights = np.array(examples) / sum(examples)
    for name in layout.trainable:
        pairs = zip(weights, trained, strict=True)
        expected = sum(w * t[name].astype(np.float64) for w, t in pairs)
        np.testing.assert_allclose(merged[name], expected, atol=1e-6)


def test_buffers_are_averaged_by_samples_whatever_the_strategy(flower_identity, grid, rng):
    layout = layout_for()
    global_state = grid_state(rng)
    trained = [grid_state(rng) for _ in range(4)]
    examples = [1, 1, 1, 5]
    for inner in (FedMedian(), Krum()):
        strategy = CompressedUpdateStrategy(inner, layout, get_codec("none"))
        merged, _, _ = one_round(strategy, grid, global_state, trained, examples, "none")
        assert strategy.traffic[1].statistics_replies == len(trained)
        for name in layout.buffers:
            pairs = zip(examples, trained, strict=True)
            expected = sum(c * t[name].astype(np.float64) for c, t in pairs)
            np.testing.assert_allclose(merged[name], expected / sum(examples), atol=1e-6)


@pytest.mark.parametrize("inner_class", [FedAvg, FedAdam])
def test_partial_model_keeps_untrained_arrays(flower_identity, grid, rng, inner_class):
    """Flower's FedAvg would make the trained subset the whole model and FedAdam would refuse
    it; wrapped, the frozen arrays stay and the trained ones change."""
    head = {n for n in MODEL.parameter_shapes() if n.startswith("layers.28")}
    layout = layout_for(head)
    global_state = grid_state(rng)
    trained = [{n: v + on_grid(rng, v.shape) for n, v in global_state.items()} for _ in range(4)]
    strategy = CompressedUpdateStrategy(inner_class(), layout, get_codec("none"))
    merged, _, messages = one_round(strategy, grid, global_state, trained, [1, 2, 3, 4], "int8")
    assert set(merged) == set(global_state)
    for name in layout.frozen:
        np.testing.assert_array_equal(merged[name], global_state[name])
    for name in layout.trainable:
        assert not np.array_equal(merged[name], global_state[name])
    sent = received_state(messages[0], layout)
    assert set(sent) == set(layout.trainable) | set(layout.buffers)


def test_downlink_carries_only_travelling_arrays_and_is_counted(flower_identity, grid, rng):
    head = {n for n in MODEL.parameter_shapes() if n.startswith("layers.28")}
    layout = layout_for(head)
    global_state = grid_state(rng)
    strategy = CompressedUpdateStrategy(FedAvg(), layout, get_codec("fp16"))
    messages = list(strategy.configure_train(3, record_of(global_state), ConfigRecord(), grid))
    assert len(messages) == 4
    blob = bundle_of(messages[0].content)
    travelling = {n: global_state[n] for n in layout.travelling}
    assert blob == encode_update(travelling, get_codec("fp16")).blob
    assert strategy.traffic[3].downlink_bytes == 4 * len(blob)
    assert messages[0].content["config"]["server-round"] == 3


def test_bad_replies_are_refused_and_the_rest_aggregated(flower_identity, grid, rng):
    layout = layout_for()
    global_state = grid_state(rng)
    trained = [grid_state(rng) for _ in range(4)]
    strategy = CompressedUpdateStrategy(FedAvg(), layout, get_codec("none"))
    messages = list(strategy.configure_train(1, record_of(global_state), ConfigRecord(), grid))
    received = received_state(messages[0], layout)
    replies = client_replies(messages, trained, [1, 1, 1, 1], received, "none", layout)
    truncated = bundle_of(replies[0].content)[:-3]
    replies[0].content["arrays"] = bundle_record(truncated)
    nan_change = {n: np.full(layout.shapes[n], np.nan, np.float32) for n in layout.travelling}
    replies[1].content["arrays"] = bundle_record(encode_update(nan_change,
                                                               get_codec("none")).blob)
    sent_bytes = sum(len(bundle_of(r.content)) for r in replies)
    arrays, _ = strategy.aggregate_train(1, replies)
    traffic = strategy.traffic[1]
    assert (traffic.replies, traffic.rejected) == (4, 2)
    merged = state_of(arrays)
    for name in layout.trainable:
        expected = (trained[2][name].astype(np.float64) + trained[3][name]) / 2
        np.testing.assert_allclose(merged[name], expected, atol=1e-6)
    assert traffic.uplink_bytes == sent_bytes


def test_all_replies_refused_keeps_the_model(flower_identity, grid, rng):
    layout = layout_for()
    strategy = CompressedUpdateStrategy(FedAvg(), layout, get_codec("none"))
    messages = list(strategy.configure_train(1, record_of(grid_state(rng)), ConfigRecord(), grid))
    replies = [Message(RecordDict({"arrays": bundle_record(b"junk"),
                                   "metrics": MetricRecord({"num-examples": 1})}), reply_to=m)
               for m in messages]
    assert strategy.aggregate_train(1, replies) == (None, None)
    assert strategy.traffic[1].rejected == 4


def test_sparse_updates_leave_unsent_arrays_at_the_global_value(flower_identity, grid, rng):
    layout = layout_for()
    global_state = grid_state(rng)
    trained = [{n: v + 1.0 for n, v in global_state.items()} for _ in range(4)]
    strategy = CompressedUpdateStrategy(FedAvg(), layout, get_codec("none"))
    merged, _, _ = one_round(strategy, grid, global_state, trained, [1, 1, 1, 1], "topk:0.01")
    changed = [n for n in layout.travelling if not np.array_equal(merged[n], global_state[n])]
    assert changed, "the largest arrays send entries at 1%"
    for name in layout.travelling:
        difference = merged[name] - global_state[name]
        assert set(np.unique(difference)) <= {0.0, 1.0}


def test_federated_evaluation_gets_the_encoded_model(flower_identity, grid, rng):
    layout = layout_for()
    global_state = grid_state(rng)
    strategy = CompressedUpdateStrategy(FedAvg(fraction_evaluate=0.5), layout,
                                        get_codec("none"))
    messages = list(strategy.configure_evaluate(2, record_of(global_state), ConfigRecord(),
                                                grid))
    assert len(messages) == 2
    received = received_state(messages[0], layout)
    for name in layout.travelling:
        np.testing.assert_array_equal(received[name], global_state[name])
    assert strategy.traffic[2].evaluate_downlink_bytes == 2 * len(bundle_of(messages[0].content))
    replies = [Message(RecordDict({"metrics": MetricRecord({"num-examples": n, "accuracy": a})}),
                       reply_to=m) for m, n, a in zip(messages, [1, 3], [0.2, 0.6], strict=True)]
    metrics = strategy.aggregate_evaluate(2, replies)
    assert metrics["accuracy"] == pytest.approx(0.5)


def test_statistics_left_out_by_every_client_keep_the_global_ones(flower_identity, grid, rng):
    layout = layout_for()
    global_state = grid_state(rng)
    strategy = CompressedUpdateStrategy(FedAvg(), layout, get_codec("none"))
    messages = list(strategy.configure_train(1, record_of(global_state), ConfigRecord(), grid))
    received = received_state(messages[0], layout)
    replies = []
    for message in messages:
        trained = grid_state(rng)
        changes = {n: trained[n] - received[n] for n in layout.travelling}
        blob = encode_update(changes, get_codec("none"), omit=layout.buffers).blob
        replies.append(Message(RecordDict({"arrays": bundle_record(blob), "metrics":
                                           MetricRecord({"num-examples": 3, "loss": 1.0})}),
                               reply_to=message))
    merged = state_of(strategy.aggregate_train(1, replies)[0])
    assert strategy.traffic[1].statistics_replies == 0
    for name in layout.buffers:
        np.testing.assert_array_equal(merged[name], global_state[name])
    assert any(not np.array_equal(merged[n], global_state[n]) for n in layout.trainable)
