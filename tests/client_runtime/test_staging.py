"""Both upload paths (mapped slots, pinned slots with non-blocking writes) deliver the same bytes:
training through either is bitwise identical, slots are reused only after their copies, and the
path is chosen by the device's memory, a constructor argument or MGFL_STAGING."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

from client_runtime.graph import OptimizerConfig
from client_runtime.staging import STAGING_ENV, StagingRing, resolve_staging_mode
from client_runtime.step import CompiledStep
from mgfl.models import ReferenceTrainer, build_model

STEPS = 5  # more than the ring's two slots: every slot is rewritten after its earlier copies
DSCNN = dict(input_shape=(1, 25, 10), num_classes=10, channels=16)


def _batches(model, batch: int, count: int, seed: int):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(count, batch, *model.input_shape)).astype(np.float32)
    ys = rng.integers(0, model.num_classes, size=(count, batch)).astype(np.int32)
    return xs, ys


def _train(device, model, batch, xs, ys, staging, read_each_step, **options):
    """Losses (per step, or one mean when not read between steps), final state, evaluation."""
    opt = OptimizerConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-4)
    step = CompiledStep(device, model, batch, model.init_state(seed=4), optimizer=opt,
                        staging=staging, **options)
    assert step.staging.mode == staging
    losses = []
    for x, y in zip(xs, ys, strict=True):
        step.train_step(x, y)  # no wait: the next batch is written while this one computes
        if read_each_step:
            losses.append(step.read_train_stats()["loss"])
    if not read_each_step:
        losses.append(step.read_train_stats()["loss"])
    state = step.get_state()
    evaluation = step.evaluate(xs[0][:-1], ys[0][:-1])  # a padded last batch
    step.close()
    return losses, state, evaluation


def _assert_bitwise_equal(first, second):
    losses_a, state_a, eval_a = first
    losses_b, state_b, eval_b = second
    assert losses_a == losses_b
    assert eval_a == eval_b
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert np.array_equal(state_a[name], state_b[name]), name


@pytest.mark.parametrize("read_each_step", [True, False])
@pytest.mark.parametrize(
    ("name", "batch", "options"),
    [("mlp", 3, {}), ("dscnn", 4, DSCNN)],
)
def test_pinned_and_mapped_uploads_train_bitwise_identically(
    device, name, batch, options, read_each_step
):
    model = build_model(name, **options)
    xs, ys = _batches(model, batch, STEPS, seed=5)
    mapped = _train(device, model, batch, xs, ys, "map", read_each_step)
    pinned = _train(device, model, batch, xs, ys, "pinned", read_each_step)
    _assert_bitwise_equal(mapped, pinned)
    assert np.all(np.isfinite(mapped[0]))


def test_pinned_uploads_with_micro_batches_match_mapped_ones(device):
    model = build_model("mlp")
    xs, ys = _batches(model, 6, STEPS, seed=6)
    runs = [_train(device, model, 6, xs, ys, mode, False, accumulation_steps=3)
            for mode in ("map", "pinned")]
    _assert_bitwise_equal(*runs)


def test_pinned_path_follows_the_float64_reference(device):
    model = build_model("mlp")
    xs, ys = _batches(model, 3, STEPS, seed=7)
    losses, state, _ = _train(device, model, 3, xs, ys, "pinned", True)
    ref = ReferenceTrainer(model, model.init_state(seed=4), optimizer="sgd", lr=0.05,
                           momentum=0.9, weight_decay=1e-4)
    expected = [ref.train_step(x, y) for x, y in zip(xs, ys, strict=True)]
    np.testing.assert_allclose(losses, expected, rtol=1e-3)
    for key, value in ref.state.items():
        np.testing.assert_allclose(state[key], value, rtol=2e-3, atol=2e-4, err_msg=key)


def test_the_step_uploads_a_pinned_batch_with_one_write(device):
    """The planner places the labels at the input's next aligned offset with nothing between, so
    the pinned slot mirrors that block (padding included) and one write fills both tensors."""
    model = build_model("mlp")
    step = CompiledStep(device, model, 3, model.init_state(0), staging="pinned")
    x, y = step.plan.placements["input"], step.plan.placements["labels"]
    assert y.offset - x.offset == step.staging.labels_at > step.staging.x_bytes  # padded
    assert y.offset % step.plan.alignment == 0
    step.plan.check_no_live_overlap()
    assert step.staging.joint
    rng = np.random.default_rng(8)
    batch_x = rng.normal(size=(3, *model.input_shape)).astype(np.float32)
    batch_y = np.array([2, 0, 5], np.int32)
    events = step.staging.send(batch_x, batch_y, step.views["input"], step.views["labels"],
                               joint=(step.arena, x.offset))
    assert len(events) == 1
    got_x, got_y = np.empty_like(batch_x), np.empty_like(batch_y)
    cl.enqueue_copy(device.queue, got_x, step.views["input"])
    cl.enqueue_copy(device.queue, got_y, step.views["labels"])
    assert np.array_equal(got_x, batch_x) and np.array_equal(got_y, batch_y)
    step.close()


@pytest.mark.parametrize("mode", ["map", "pinned"])
def test_a_ring_delivers_every_batch_into_separate_tensors(device, mode):
    """Without a joint destination (both paths: two copies), batch after batch through reused
    slots, the device tensors hold exactly the last batch sent."""
    shape_x, shape_y = (4, 7), (4,)
    ring = StagingRing(device, shape_x, shape_y, mode=mode)
    assert not ring.joint
    flags = cl.mem_flags.READ_WRITE
    dst_x = cl.Buffer(device.context, flags, 4 * 7 * 4)
    dst_y = cl.Buffer(device.context, flags, 4 * 4)
    rng = np.random.default_rng(9)
    for _ in range(STEPS):
        batch_x = rng.normal(size=shape_x).astype(np.float32)
        batch_y = rng.integers(0, 100, size=shape_y).astype(np.int32)
        assert len(ring.send(batch_x, batch_y, dst_x, dst_y)) == 2
        got_x, got_y = np.empty_like(batch_x), np.empty_like(batch_y)
        cl.enqueue_copy(device.queue, got_x, dst_x)
        cl.enqueue_copy(device.queue, got_y, dst_y)
        assert np.array_equal(got_x, batch_x) and np.array_equal(got_y, batch_y)
    with pytest.raises(ValueError, match="expected"):
        ring.send(np.zeros((3, 7), np.float32), batch_y, dst_x, dst_y)
    ring.close()
    assert ring.slots == []


def test_the_device_memory_chooses_the_path(device):
    unified = SimpleNamespace(info=dataclasses.replace(device.info, host_unified_memory=True))
    discrete = SimpleNamespace(info=dataclasses.replace(device.info, host_unified_memory=False))
    assert resolve_staging_mode(unified) == "map"
    assert resolve_staging_mode(discrete) == "pinned"
    assert resolve_staging_mode(discrete, "auto") == "pinned"
    assert resolve_staging_mode(discrete, "map") == "map"
    assert resolve_staging_mode(unified, " Pinned ") == "pinned"
    with pytest.raises(ValueError, match="map, pinned"):
        resolve_staging_mode(unified, "zero-copy")


def test_mgfl_staging_selects_the_path_unless_the_step_names_one(device, monkeypatch):
    model = build_model("mlp")
    state = model.init_state(0)
    monkeypatch.setenv(STAGING_ENV, "pinned")
    step = CompiledStep(device, model, 2, state)
    assert step.staging.mode == "pinned"
    step.close()
    step = CompiledStep(device, model, 2, state, staging="map")
    assert step.staging.mode == "map"
    step.close()
    monkeypatch.setenv(STAGING_ENV, "sideways")
    with pytest.raises(ValueError, match=STAGING_ENV):
        CompiledStep(device, model, 2, state)
