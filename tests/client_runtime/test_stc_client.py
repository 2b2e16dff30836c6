"""A client under the stc codec: one compact bundle whose BatchNorm statistics are those of the
model the server will hold (received weights plus what the update sends), measured on the
client's samples without moving its weights."""

from __future__ import annotations

import numpy as np

from client_runtime import federated
from client_runtime.graph import OptimizerConfig
from mgfl.codecs import decode_update
from mgfl.flower_records import bundle_of
from tests.client_runtime.test_app import (  # noqa: F401  (flower_identity: autouse fixture)
    WITH_BUFFERS,
    flower_identity,
    node_context,
    setup,
    train_message,
)


def test_stc_reply_is_one_compact_bundle_with_measured_statistics():
    config, _, layout, initial = setup({**WITH_BUFFERS, "codec": "stc:0.05"})
    context = node_context()
    reply = federated.train_round(train_message(config, layout, initial).content, context)
    blob = bundle_of(reply)
    assert blob[:3] == b"MGC"
    assert reply["metrics"]["uplink-bytes"] == len(blob)
    travelling = {n: np.asarray(initial[n], np.float32) for n in layout.travelling}
    changes = decode_update(blob, layout.travelling_shapes(), reference=travelling)
    assert set(layout.buffers) <= set(changes)
    for name in layout.buffers:
        assert np.all(np.isfinite(initial[name] + changes[name]))
        if name.endswith("running_var"):
            assert np.all(initial[name] + changes[name] > 0)
    residual = context.state[federated.RESIDUAL_KEY]
    assert set(residual) == set(layout.trainable)


def test_measured_statistics_leave_the_weights_and_restore_the_learning_rate(device):
    config, model, layout, initial = setup(WITH_BUFFERS)
    data = federated.client_data(config, 0, 4)
    optimizer = OptimizerConfig(name=config.optimizer, lr=config.lr)
    step = federated._compiled_step(device, model, config.batch, initial,
                                    set(layout.trainable), optimizer)
    measured = federated.measure_statistics(step, initial, layout.buffers, data, config.batch,
                                            seed=5, lr=config.lr)
    after = step.get_state(list(layout.trainable))
    for name in layout.trainable:
        np.testing.assert_array_equal(after[name], initial[name])
    assert any(not np.allclose(measured[n], initial[n]) for n in layout.buffers)
    x = np.ascontiguousarray(data.x_train[:config.batch], np.float32)
    y = np.ascontiguousarray(data.y_train[:config.batch], np.int32)
    step.train_step(x, y)
    moved = step.get_state(list(layout.trainable))
    assert any(not np.array_equal(moved[n], initial[n]) for n in layout.trainable)


def test_top_k_statistics_are_measured_on_the_model_the_server_will_hold(monkeypatch):
    """Top-k sends a few weights, so the locally trained statistics would not fit the server's
    model: like stc, the client measures them on the received weights plus what it sends."""
    config, _, layout, initial = setup({**WITH_BUFFERS, "codec": "topk:0.05"})
    seen = {}
    measure = federated.measure_statistics

    def recording(step, state, *args, **kwargs):
        seen.update({n: np.array(state[n]) for n in layout.trainable})
        return measure(step, state, *args, **kwargs)

    monkeypatch.setattr(federated, "measure_statistics", recording)
    reply = federated.train_round(train_message(config, layout, initial).content, node_context())
    changes = decode_update(bundle_of(reply), layout.travelling_shapes())
    assert set(seen) == set(layout.trainable)
    for name in layout.trainable:
        sent = changes.get(name, np.zeros_like(initial[name]))
        np.testing.assert_array_equal(seen[name], np.asarray(initial[name], np.float32) + sent)
    assert set(layout.buffers) <= set(changes)


def test_statistics_stay_home_in_the_rounds_that_do_not_send_them(monkeypatch):
    """With statistics-every=2 the client neither measures nor sends its statistics in round 1;
    in round 2 it does, and the residual of the weights carries on across both."""
    config, _, layout, initial = setup({**WITH_BUFFERS, "codec": "stc:0.05",
                                        "statistics-every": 2, "num-rounds": 4})
    measured = []
    measure = federated.measure_statistics

    def counting(*args, **kwargs):
        measured.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(federated, "measure_statistics", counting)
    context = node_context()
    sizes = []
    for server_round, sends in ((1, False), (2, True)):
        reply = federated.train_round(
            train_message(config, layout, initial, server_round=server_round).content, context)
        changes = decode_update(bundle_of(reply), layout.travelling_shapes(),
                                reference={n: np.asarray(initial[n], np.float32)
                                           for n in layout.travelling})
        assert bool(set(layout.buffers) & set(changes)) == sends
        assert len(measured) == int(sends)
        assert set(context.state[federated.RESIDUAL_KEY]) == set(layout.trainable)
        sizes.append(reply["metrics"]["uplink-bytes"])
    assert sizes[0] < sizes[1]
