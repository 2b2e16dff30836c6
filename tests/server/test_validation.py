"""Crafted bad replies through the strategy's aggregation: each is rejected with its node and the
reason, the round goes on with the good replies, and the global model never becomes non-finite."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM

from mgfl.codecs import encode_record, encode_update, get_codec
from mgfl.codecs.wire import varint
from mgfl.flower_records import bundle_record
from mgfl.models.zoo import build_model
from mgfl.update_layout import UpdateLayout
from server.compressed import CompressedUpdateStrategy, record_of, state_of
from server.validation import ReplyLimits, ReplyRejected, validate_update, validate_weight

MODEL = build_model("mlp", input_shape=(1, 4, 4), num_classes=3)
LAYOUT = UpdateLayout.of(MODEL, set(MODEL.parameter_shapes()))
NAME = LAYOUT.travelling[0]
SHAPE = LAYOUT.shapes[NAME]


def global_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.normal(size=s).astype(np.float32) for n, s in LAYOUT.shapes.items()}


def changes(value: float = 0.5) -> dict[str, np.ndarray]:
    return {n: np.full(LAYOUT.shapes[n], value, np.float32) for n in LAYOUT.travelling}


def bundle(records: list[bytes], version: int = 1) -> bytes:
    return b"MGU" + bytes([version]) + varint(len(records)) + b"".join(records)


def none_record(name: str, array: np.ndarray) -> bytes:
    return encode_record(name, array, 0, array.astype(array.dtype.newbyteorder("<")).tobytes())


GOOD = encode_update(changes(), get_codec("none")).blob
ONE = none_record(NAME, np.zeros(SHAPE, np.float32))

# name -> (bundle bytes, metrics, words the reason must contain)
MALFORMED = {
    "bad magic": (b"XYZ" + GOOD[3:], None, "bad magic"),
    "bundle version": (b"MGU\x02" + GOOD[4:], None, "version 2"),
    "record version": (bundle([ONE[:2] + b"\x07" + ONE[3:]]), None, "version 7"),
    "unknown codec": (bundle([ONE[:3] + b"\x63" + ONE[4:]]), None, "codec id 99"),
    "unknown name": (bundle([none_record("intruder.weight", np.zeros(SHAPE, np.float32))]),
                     None, "unexpected array"),
    "wrong shape": (bundle([none_record(NAME, np.zeros((1, *SHAPE), np.float32))]), None,
                    "shape"),
    "wrong dtype": (bundle([none_record(NAME, np.zeros(SHAPE, np.float64))]), None, "float64"),
    "NaN": (bundle([none_record(NAME, np.full(SHAPE, np.nan, np.float32))]), None, "NaN"),
    "infinity": (bundle([none_record(NAME, np.full(SHAPE, -np.inf, np.float32))]), None,
                 "infinite"),
    "truncated": (GOOD[:-3], None, "more bytes"),
    "trailing bytes": (GOOD + b"\x00", None, "trailing"),
    "repeated array": (bundle([ONE, ONE]), None, "twice"),
    "too many records": (bundle([ONE] * (len(LAYOUT.travelling) + 1)), None, "records"),
    "oversized": (GOOD + b"\x00" * 10_000_000, None, "exceeds the bound"),
    "empty": (b"", None, "more bytes"),
    "zero examples": (GOOD, {"num-examples": 0}, "not a finite positive"),
    "negative examples": (GOOD, {"num-examples": -5}, "not a finite positive"),
    "NaN examples": (GOOD, {"num-examples": float("nan")}, "not a finite positive"),
    "missing examples": (GOOD, {"loss": 1.0}, "lack num-examples"),
}


def reply_to(message: Message, blob: bytes | None, metrics: dict | None = None,
              record: ArrayRecord | None = None) -> Message:
    content = RecordDict({"arrays": record if record is not None else bundle_record(blob),
                          "metrics": MetricRecord(metrics or {"num-examples": 10})})
    return Message(content, reply_to=message)


def run_round(strategy, grid, replies_for):
    state = global_state()
    messages = list(strategy.configure_train(1, record_of(state), ConfigRecord(), grid))
    arrays, _ = strategy.aggregate_train(1, replies_for(messages))
    return state, arrays, int(messages[0].metadata.dst_node_id)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_reply_is_rejected_and_the_round_goes_on(flower_identity, grid, case):
    blob, metrics, reason = MALFORMED[case]
    strategy = CompressedUpdateStrategy(FedAvg(), LAYOUT, get_codec("none"))

    def replies(messages):
        return [reply_to(messages[0], blob, metrics),
                *(reply_to(m, GOOD) for m in messages[1:])]

    state, arrays, first_node = run_round(strategy, grid, replies)
    traffic = strategy.traffic[1]
    assert (traffic.replies, traffic.rejected) == (4, 1)
    [rejection] = traffic.rejections
    assert rejection["node"] == first_node and reason in rejection["reason"], rejection
    merged = state_of(arrays)
    for name in LAYOUT.travelling:  # the three good replies all sent +0.5
        np.testing.assert_allclose(merged[name], state[name] + 0.5, rtol=1e-6)


def test_foreign_records_are_rejected(flower_identity, grid):
    strategy = CompressedUpdateStrategy(FedAvg(), LAYOUT, get_codec("none"))
    foreign = ArrayRecord({"update": Array(np.zeros(4, np.float32))})

    def replies(messages):
        return [reply_to(messages[0], None, record=foreign),
                *(reply_to(m, GOOD) for m in messages[1:])]

    run_round(strategy, grid, replies)
    assert "not an mgfl bundle" in strategy.traffic[1].rejections[0]["reason"]


def test_norm_bound_rejects_large_changes_only(flower_identity, grid):
    bound = float(np.sqrt(sum(np.prod(LAYOUT.shapes[n]) for n in LAYOUT.travelling))) * 0.6
    limits = ReplyLimits.for_layout(LAYOUT, norm_bound=bound)
    strategy = CompressedUpdateStrategy(FedAvg(), LAYOUT, get_codec("none"), limits=limits)
    large = encode_update(changes(1.0), get_codec("none")).blob

    def replies(messages):
        return [reply_to(messages[0], large), *(reply_to(m, GOOD) for m in messages[1:])]

    run_round(strategy, grid, replies)
    assert "L2 norm" in strategy.traffic[1].rejections[0]["reason"]
    assert strategy.traffic[1].rejected == 1


def test_a_change_that_overflows_the_global_model_is_rejected(flower_identity, grid):
    """Each value of the change is finite, global + change is not."""
    huge = encode_update(changes(3.4e38), get_codec("none")).blob
    big_global = {n: np.full(s, 3.0e38, np.float32) for n, s in LAYOUT.shapes.items()}
    strategy = CompressedUpdateStrategy(FedAvg(), LAYOUT, get_codec("none"))
    messages = list(strategy.configure_train(1, record_of(big_global), ConfigRecord(), grid))
    arrays, _ = strategy.aggregate_train(1, [reply_to(messages[0], huge),
                                             *(reply_to(m, GOOD) for m in messages[1:])])
    assert "overflows" in strategy.traffic[1].rejections[0]["reason"]
    assert all(np.all(np.isfinite(v)) for v in state_of(arrays).values())


def test_a_non_finite_aggregate_keeps_the_previous_model(flower_identity, grid):
    """Good replies, but a server step that overflows: the round keeps the global model."""
    inner = FedAvgM(server_learning_rate=1e39, server_momentum=0.0)
    strategy = CompressedUpdateStrategy(inner, LAYOUT, get_codec("none"))
    _, arrays, _ = run_round(strategy, grid, lambda ms: [reply_to(m, GOOD) for m in ms])
    assert arrays is None
    assert strategy.traffic[1].aggregated is False
    assert "not finite" in strategy.traffic[1].note


def test_fewer_usable_replies_than_the_minimum_keep_the_model(flower_identity, grid):
    strategy = CompressedUpdateStrategy(FedAdam(), LAYOUT, get_codec("none"), min_replies=3)

    def replies(messages):
        return [reply_to(messages[0], b"junk"), reply_to(messages[1], b""),
                *(reply_to(m, GOOD) for m in messages[2:])]

    _, arrays, _ = run_round(strategy, grid, replies)
    assert arrays is None
    assert strategy.traffic[1].rejected == 2
    assert "fewer than min-replies 3" in strategy.traffic[1].note


def test_default_size_bound_admits_every_codec_of_the_model():
    limits = ReplyLimits.for_layout(LAYOUT)
    for spec in ("none", "fp16", "int8", "int8-channel", "topk:1", "stc:1"):
        blob = encode_update(changes(), get_codec(spec)).blob
        assert len(blob) <= limits.max_bytes
        validate_update(blob, LAYOUT, global_state(), limits)
    with pytest.raises(ReplyRejected, match="exceeds"):
        validate_update(GOOD, LAYOUT, global_state(), ReplyLimits(max_bytes=len(GOOD) - 1))


@pytest.mark.parametrize("value", [True, "12", None])
def test_sample_counts_must_be_numbers(value):
    with pytest.raises(ReplyRejected, match="not a number"):
        validate_weight(value, "num-examples")


def test_compact_stc_replies_decode_against_the_global_model():
    """An stc reply of a model with BatchNorm: the server decodes it against its global
    statistics and gets exactly what the client sent, with every variance still positive."""
    model = build_model("dscnn", input_shape=(1, 40, 32), num_classes=10)
    layout = UpdateLayout.of(model, set(model.parameter_shapes()))
    rng = np.random.default_rng(3)
    state = {n: rng.normal(size=s).astype(np.float32) for n, s in layout.shapes.items()}
    for name in layout.buffers:
        if name.endswith("running_var"):
            state[name] = rng.uniform(0.01, 4.0, layout.shapes[name]).astype(np.float32)
    change = {n: (rng.normal(size=layout.shapes[n]) * 0.01).astype(np.float32)
              for n in layout.travelling}
    for name in layout.buffers:
        change[name] = (state[name] * rng.uniform(-0.9, 2.0, layout.shapes[name])
                        ).astype(np.float32)
    codec = get_codec("stc:0.02")
    encoded = encode_update(change, codec, None, rng, reference=state,
                            codec_of={n: codec for n in layout.buffers})
    decoded = validate_update(encoded.blob, layout, state, ReplyLimits.for_layout(layout))
    for name, array in decoded.items():
        np.testing.assert_array_equal(array, encoded.sent[name])
    for name in layout.buffers:
        if name.endswith("running_var"):
            assert np.all(state[name] + decoded[name] > 0)
    with pytest.raises(ReplyRejected, match="layout"):
        validate_update(encoded.blob, LAYOUT, global_state(), ReplyLimits.for_layout(LAYOUT))

