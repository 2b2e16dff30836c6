"""The ClientApp: from a training message (encoded global arrays and the run configuration) to a
reply (the encoded change and the round's metrics), on the test device."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client_runtime import federated
from client_runtime.app import app as client_app
from client_runtime.freezing import resolve_trainable
from client_runtime.graph import OptimizerConfig
from client_runtime.proximal import ProximalPull
from client_runtime.step import CompiledStep, estimate_memory
from kernels.launch import run as run_launches
from mgfl.codecs import decode_update, encode_update, get_codec
from mgfl.flower_records import bundle_of, bundle_record
from mgfl.models.zoo import build_model
from mgfl.run_config import RunConfig
from mgfl.update_layout import UpdateLayout

SMALL = {"dataset": "synthetic:1,8,8:4", "model": "mlp", "batch": 16, "local-steps": 3,
         "lr": 0.05, "eval-batch": 64}
WITH_BUFFERS = {"dataset": "synthetic:6,1,32:3", "model": "cnn1d", "batch": 8, "local-steps": 2,
                "lr": 0.05, "eval-batch": 32}


@pytest.fixture(autouse=True)
def flower_identity(device):  # the device fixture sets a private program cache
    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 3, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


def setup(values: dict):
    config = RunConfig.from_mapping(values)
    dataset = federated._dataset(config.dataset)
    model = build_model(config.model, input_shape=dataset.input_shape,
                        num_classes=dataset.num_classes)
    layout = UpdateLayout.of(model, resolve_trainable(model, config.freeze))
    initial = model.init_state(config.model_seed)
    return config, model, layout, initial


def train_message(config: RunConfig, layout: UpdateLayout, state: dict, server_round: int = 1,
                  digest: str | None = None, downlink: str = "none") -> Message:
    travelling = {n: np.asarray(state[n], np.float32) for n in layout.travelling}
    settings = ConfigRecord({**config.to_mapping(), "server-round": server_round,
                             "frozen-digest": digest or layout.frozen_digest(state)})
    content = RecordDict({"arrays": bundle_record(encode_update(travelling,
                                                                get_codec(downlink)).blob),
                          "config": settings})
    return Message(content, dst_node_id=11, message_type=MessageType.TRAIN)


def node_context(partition_id: int = 0, partitions: int = 4) -> Context:
    return Context(run_id=3, node_id=11, node_config={"partition-id": partition_id,
                                                      "num-partitions": partitions},
                   state=RecordDict(), run_config={})


def test_train_reply_carries_the_encoded_change_and_metrics():
    config, _, layout, initial = setup(SMALL)
    message = train_message(config, layout, initial)
    reply = client_app(message, node_context())
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    blob = bundle_of(reply.content)
    changes = decode_update(blob, layout.travelling_shapes())
    assert set(changes) == set(layout.travelling)
    assert all(np.any(changes[n] != 0) for n in layout.trainable)
    metrics = reply.content["metrics"]
    assert metrics["uplink-bytes"] == len(blob)
    assert metrics["downlink-bytes"] == len(bundle_of(message.content))
    assert metrics["num-examples"] == 128  # 512 synthetic samples over 4 natural groups
    assert metrics["steps"] == 3 and metrics["batch"] == 16
    for key in ("train-loss", "train-accuracy", "loss", "accuracy", "train-time-s",
                "data-movement-share", "peak-device-bytes", "programs-compiled",
                "programs-from-disk"):
        assert key in metrics


def test_frozen_arrays_stay_home_and_buffers_travel():
    config, _, layout, initial = setup({**WITH_BUFFERS, "freeze": "head"})
    assert layout.frozen and layout.buffers
    reply = client_app(train_message(config, layout, initial), node_context(1, 4))
    changes = decode_update(bundle_of(reply.content), layout.travelling_shapes())
    assert set(changes) == set(layout.trainable) | set(layout.buffers)
    assert any(np.any(changes[n] != 0) for n in layout.buffers)


def test_error_feedback_residual_lives_in_the_node_state():
    config, _, layout, initial = setup({**SMALL, "codec": "topk:0.05"})
    context = node_context()
    first = client_app(train_message(config, layout, initial, 1), context)
    residual = {n: a.numpy() for n, a in context.state[federated.RESIDUAL_KEY].items()}
    assert set(residual) == set(layout.travelling)
    sent = decode_update(bundle_of(first.content), layout.travelling_shapes())
    for name in layout.trainable:
        values = sent.get(name, np.zeros_like(residual[name]))
        chosen = values != 0
        assert chosen.sum() <= 0.05 * values.size + 1  # the share top-k sends
        # what was sent is in float16: its rounding error is all that stays behind there
        assert np.all(np.abs(residual[name][chosen]) <= 2.0**-10 * np.abs(values[chosen]))
        assert np.any(residual[name][~chosen] != 0)  # the rest waits for the next rounds
    client_app(train_message(config, layout, initial, 2), context)
    after = {n: a.numpy() for n, a in context.state[federated.RESIDUAL_KEY].items()}
    assert any(not np.array_equal(after[n], residual[n]) for n in layout.trainable)


def test_batchnorm_statistics_travel_dense_beside_a_sparse_update():
    config, _, layout, initial = setup({**WITH_BUFFERS, "codec": "topk:0.01"})
    context = node_context()
    reply = federated.train_round(train_message(config, layout, initial).content, context)
    changes = decode_update(bundle_of(reply), layout.travelling_shapes())
    assert set(layout.buffers) <= set(changes)
    assert all(np.count_nonzero(changes[n]) > changes[n].size // 2 for n in layout.buffers)
    residual = context.state[federated.RESIDUAL_KEY]
    assert set(residual) == set(layout.trainable)


def test_a_different_frozen_model_is_refused():
    config, _, layout, initial = setup({**SMALL, "freeze": "head"})
    message = train_message(config, layout, initial, digest="0" * 16)
    with pytest.raises(ValueError, match="frozen arrays"):
        federated.train_round(message.content, node_context())


def test_natural_partition_needs_one_node_per_group():
    config, _, layout, initial = setup(SMALL)
    with pytest.raises(ValueError, match="has 4 clients"):
        federated.train_round(train_message(config, layout, initial).content,
                              node_context(0, 6))


def test_a_node_without_partition_is_told_how_to_start():
    config, _, layout, initial = setup(SMALL)
    context = Context(run_id=3, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="partition-id"):
        federated.train_round(train_message(config, layout, initial).content, context)


def test_memory_budget_shrinks_the_batch_or_refuses():
    config, model, layout, initial = setup({**SMALL, "batch": 64})
    optimizer = OptimizerConfig(name=config.optimizer, lr=config.lr)
    one, full = (estimate_memory(model, b, None, optimizer).peak_bytes for b in (1, 64))
    budget = (one + full) // 2
    config, _, layout, initial = setup({**SMALL, "batch": 64, "memory-budget": str(budget)})
    reply = federated.train_round(train_message(config, layout, initial).content,
                                  node_context())
    assert 1 < reply["metrics"]["batch"] < 64
    config, _, layout, initial = setup({**SMALL, "memory-budget": str(one // 2)})
    with pytest.raises(MemoryError, match="memory-budget"):
        federated.train_round(train_message(config, layout, initial).content, node_context())


def test_compiled_steps_are_shared_across_clients_and_bounded():
    config, _, layout, initial = setup(SMALL)
    federated._steps.clear()
    for partition_id in range(4):
        federated.train_round(train_message(config, layout, initial).content,
                              node_context(partition_id))
    assert len(federated._steps) == 1
    config16 = RunConfig.from_mapping({**SMALL, "batch": 8})
    config4 = RunConfig.from_mapping({**SMALL, "batch": 4})
    for other in (config16, config4):
        federated.train_round(train_message(other, layout, initial).content, node_context())
    assert len(federated._steps) == federated.MAX_CACHED_STEPS


def test_fedprox_pulls_the_change_towards_the_global_model():
    norms = {}
    for strategy in ("fedavg", "fedprox"):
        config, _, layout, initial = setup({**SMALL, "strategy": strategy, "proximal-mu": 5.0,
                                            "local-steps": 8, "momentum": 0.0})
        reply = federated.train_round(train_message(config, layout, initial).content,
                                      node_context())
        changes = decode_update(bundle_of(reply), layout.travelling_shapes())
        norms[strategy] = np.sqrt(sum(np.sum(c.astype(np.float64) ** 2)
                                      for c in changes.values()))
    assert norms["fedprox"] < 0.9 * norms["fedavg"]


def test_proximal_pull_is_the_proximal_step(device, rng):
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(8,))
    state = {n: rng.normal(size=s).astype(np.float32) for n, s in model.parameter_shapes().items()}
    step = CompiledStep(device, model, 4, state)
    anchors = {n: rng.normal(size=v.shape).astype(np.float32) for n, v in state.items()}
    pull = ProximalPull(step, anchors, mu=0.5, lr=0.1)
    before = len(step.train_launches)
    with pull:
        assert len(step.train_launches) == before + len(state)
    assert len(step.train_launches) == before
    run_launches(device.queue, pull.launches)
    after = step.get_state(list(state))
    for name, value in state.items():
        expected = value - 0.1 * 0.5 * (value - anchors[name])
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-6)


def test_evaluate_reply():
    config, _, layout, initial = setup(SMALL)
    message = train_message(config, layout, initial)
    evaluate = Message(message.content, dst_node_id=11, message_type=MessageType.EVALUATE)
    reply = client_app(evaluate, node_context(2))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == 32  # the group's share of 128 test samples
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] > 0
