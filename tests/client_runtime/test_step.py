"""The compiled step against the float64 NumPy reference trainer, for every model in the zoo."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest

from client_runtime.freezing import resolve_trainable
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep, estimate_memory
from mgfl.models import ReferenceTrainer, build_model
from mgfl.models.frozen_statistics import frozen_statistics_layers
from mgfl.models.zoo import ZOO

STEPS = 20
ILL_CONDITIONED = {"mobilenetv2"}
# Small inputs keep the float64 reference fast; the engine sees the same layer kinds.
CASES = {
    "mlp": dict(batch=8),
    "lenet5": dict(batch=6),
    "dscnn": dict(batch=4, input_shape=(1, 25, 10), num_classes=10, channels=16),
    "mobilenetv2": dict(batch=4, input_shape=(3, 16, 16), lr=0.005),
    "cnn1d": dict(batch=5, input_shape=(6, 1, 32)),
}


def _model(name: str):
    options = dict(CASES[name])
    options.pop("batch")
    options.pop("lr", None)
    return build_model(name, **options)


def _batches(rng, model, batch, count):
    xs = rng.normal(size=(count, batch, *model.input_shape)).astype(np.float32)
    ys = rng.integers(0, model.num_classes, size=(count, batch)).astype(np.int32)
    return xs, ys


def test_every_zoo_model_is_covered():
    assert set(CASES) == set(ZOO)


@pytest.mark.parametrize("name", sorted(CASES))
def test_twenty_sgd_steps_match_the_float64_reference(device, name):
    model = _model(name)
    batch, lr = CASES[name]["batch"], CASES[name].get("lr", 0.02)
    state = model.init_state(seed=3)
    opt = OptimizerConfig("sgd", lr=lr, momentum=0.9, weight_decay=1e-4)
    step = CompiledStep(device, model, batch, state, optimizer=opt, poison=True, poison_freed=True)
    step.plan.check_no_live_overlap()
    ref = ReferenceTrainer(model, state, optimizer="sgd", lr=lr, momentum=0.9, weight_decay=1e-4)
    xs, ys = _batches(np.random.default_rng(7), model, batch, STEPS)
    ours, theirs = [], []
    for x, y in zip(xs, ys, strict=True):
        step.train_step(x, y)
        ours.append(step.read_train_stats()["loss"])
        theirs.append(ref.train_step(x, y))
    ours, theirs = np.array(ours), np.array(theirs)
    assert np.all(np.isfinite(ours)), ours
    if name in ILL_CONDITIONED:
        _assert_within_float32_conditioning(model, state, lr, xs, ys, ours, theirs)
        return
    np.testing.assert_allclose(ours, theirs, rtol=1e-3)
    # weights agree too, and the evaluation step uses the running statistics
    final = step.get_state()
    for key, value in ref.state.items():
        np.testing.assert_allclose(final[key], value, rtol=2e-3, atol=2e-4, err_msg=key)
    ev = step.evaluate(xs[0], ys[0])
    ref_loss, ref_acc = ref.evaluate(xs[0], ys[0])
    assert ev["loss"] == pytest.approx(ref_loss, rel=1e-3)
    assert ev["accuracy"] == pytest.approx(ref_acc)


def _assert_within_float32_conditioning(model, state, lr, xs, ys, ours, theirs):
    """MobileNetV2 at random initialisation is ill-conditioned: perturbing its float64 weights by
    one float32 rounding (relative 6e-8) moves its gradients by 1-4% (ReLU6 kinks and batch
    statistics over few samples), so no float32 engine can track the float64 trajectory to 1e-3
    for 20 steps. The check is then: the first step (exact weights) agrees to 1e-5, and over 20
    steps the engine stays as close to the reference as the reference itself stays to a copy of
    itself started from weights perturbed at float32 rounding level."""
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    rng = np.random.default_rng(11)
    nudged = {k: v * (1 + 6e-8 * rng.standard_normal(v.shape)) for k, v in state.items()}
    twin = ReferenceTrainer(model, nudged, optimizer="sgd", lr=lr, momentum=0.9, weight_decay=1e-4)
    spread = np.array([twin.train_step(x, y) for x, y in zip(xs, ys, strict=True)])
    own_error = np.max(np.abs(ours - theirs) / theirs)
    float32_noise = np.max(np.abs(spread - theirs) / theirs)
    print(
        f"mobilenetv2: engine vs float64 {own_error:.2e}, "
        f"float64 vs nudged twin {float32_noise:.2e}"
    )
    assert own_error <= max(1e-3, 3 * float32_noise), (own_error, float32_noise)


def test_adam_and_frozen_layers_match_the_reference(device):
    model = _model("lenet5")
    state = model.init_state(seed=1)
    trainable = {
        n for n in model.parameter_shapes() if n.startswith(("layers.7", "layers.9", "layers.11"))
    }
    opt = OptimizerConfig("adam", lr=1e-3, weight_decay=1e-4)
    step = CompiledStep(
        device, model, 6, state, trainable=trainable, optimizer=opt, poison=True, poison_freed=True
    )
    ref = ReferenceTrainer(
        model, state, optimizer="adam", lr=1e-3, weight_decay=1e-4, trainable=trainable
    )
    xs, ys = _batches(np.random.default_rng(2), model, 6, 8)
    for x, y in zip(xs, ys, strict=True):
        step.train_step(x, y)
        assert step.read_train_stats()["loss"] == pytest.approx(ref.train_step(x, y), rel=1e-3)
    final = step.get_state()
    for name in model.parameter_shapes():
        if name not in trainable:
            np.testing.assert_array_equal(final[name], state[name])


def test_only_the_batch_and_labels_move_per_step(device):
    model = _model("lenet5")
    step = CompiledStep(device, model, 6, model.init_state(0))
    xs, ys = _batches(np.random.default_rng(0), model, 6, 5)
    for x, y in zip(xs, ys, strict=True):
        step.train_step(x, y)
    device.queue.finish()
    summary = step.profiler.summary()
    assert summary["h2d_bytes_per_step"] == 6 * prod(model.input_shape) * 4 + 6 * 4
    assert summary["d2h_bytes_per_step"] == 0
    assert 0.0 <= summary["data_movement_share"] < 1.0


def test_memory_estimate_equals_the_compiled_arena(device):
    model = _model("mobilenetv2")
    step = CompiledStep(device, model, 3, model.init_state(0))
    estimate = estimate_memory(model, 3, alignment=step.plan.alignment)
    assert estimate.peak_bytes == step.peak_bytes == step.arena.size


def test_freezing_shrinks_the_arena():
    model = _model("mobilenetv2")
    full = estimate_memory(model, 8).peak_bytes
    head = estimate_memory(
        model,
        8,
        trainable={n for n in model.parameter_shapes() if n.startswith(model.resolve()[-1].path)},
    )
    assert head.peak_bytes < full / 2


@pytest.mark.parametrize("name", ["lenet5", "cnn1d"])
def test_direct_convolution_kernels_match_the_reference_too(device, name):
    model = _model(name)
    batch, state = CASES[name]["batch"], model.init_state(seed=5)
    step = CompiledStep(device, model, batch, state, optimizer=OptimizerConfig("sgd", lr=0.02),
                        conv_impl="direct", poison=True, poison_freed=True)
    ref = ReferenceTrainer(model, state, optimizer="sgd", lr=0.02, momentum=0.9)
    xs, ys = _batches(np.random.default_rng(3), model, batch, 6)
    for x, y in zip(xs, ys, strict=True):
        step.train_step(x, y)
        assert step.read_train_stats()["loss"] == pytest.approx(ref.train_step(x, y), rel=1e-4)


@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_micro_batches_give_the_same_result_as_the_whole_batch(device, name):
    """Gradient accumulation over 4 micro-batches of 2 equals one step of 8 (models without
    BatchNorm, whose batch statistics depend on how the batch is split)."""
    model = _model(name)
    state = model.init_state(seed=2)
    opt = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
    whole = CompiledStep(device, model, 8, state, optimizer=opt)
    split = CompiledStep(device, model, 8, state, optimizer=opt, accumulation_steps=4,
                         poison=True, poison_freed=True)
    assert split.micro_batch == 2
    xs, ys = _batches(np.random.default_rng(4), model, 8, 5)
    for x, y in zip(xs, ys, strict=True):
        whole.train_step(x, y)
        split.train_step(x, y)
        a, b = whole.read_train_stats(), split.read_train_stats()
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["samples"] == b["samples"] == 8
    got_whole, got_split = whole.get_state(), split.get_state()
    for key in got_whole:
        np.testing.assert_allclose(got_split[key], got_whole[key], rtol=1e-4, atol=1e-6,
                                   err_msg=key)


def test_micro_batches_and_recomputation_shrink_an_activation_bound_arena():
    model = _model("mobilenetv2")
    whole = estimate_memory(model, 32).peak_bytes
    micro = estimate_memory(model, 8, accumulate_gradients=True).peak_bytes
    recomputed = estimate_memory(model, 32, recompute_segments=4).peak_bytes
    assert micro < whole / 2
    assert recomputed < whole * 0.75


@pytest.mark.parametrize("name", ["mobilenetv2", "dscnn"])
def test_recomputation_gives_identical_results(device, name):
    model = _model(name)
    batch, state = CASES[name]["batch"], model.init_state(seed=4)
    opt = OptimizerConfig("sgd", lr=0.01, momentum=0.9)
    plain = CompiledStep(device, model, batch, state, optimizer=opt)
    segmented = CompiledStep(device, model, batch, state, optimizer=opt, recompute_segments=3,
                             poison=True, poison_freed=True)
    assert segmented.peak_bytes < plain.peak_bytes
    xs, ys = _batches(np.random.default_rng(9), model, batch, 4)
    for x, y in zip(xs, ys, strict=True):
        plain.train_step(x, y)
        segmented.train_step(x, y)
        assert plain.read_train_stats()["loss"] == segmented.read_train_stats()["loss"]
    a, b = plain.get_state(), segmented.get_state()
    for key in a:  # running statistics too: recomputation must not update them twice
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _transfer_state(model, seed):
    """Initial weights with running statistics of a model trained before, as in transfer
    learning: the float64 reference runs batches with nothing trainable, which moves only the
    BatchNorm statistics (a frozen-statistics BatchNorm over fresh ones would be a no-op)."""
    state = model.init_state(seed=seed)
    warm = ReferenceTrainer(model, state, trainable=set())
    xs, ys = _batches(np.random.default_rng(seed), model, 8, 12)
    for x, y in zip(xs, ys, strict=True):
        warm.train_step(x, y)
    return {k: v.astype(np.float32) for k, v in warm.state.items()}


@pytest.mark.parametrize("policy", ["bias", "bias+norm"])
@pytest.mark.parametrize("name", ["dscnn", "mobilenetv2"])
def test_tinytl_policies_match_the_float64_reference(device, name, policy):
    """Twenty steps of the TinyTL policies: BatchNorms over frozen running statistics (which must
    not move), ReLU/ReLU6 backward from bit masks; losses, weights and statistics as the
    reference's. With frozen statistics MobileNetV2 is well conditioned, so no exception."""
    model = _model(name)
    batch, lr = CASES[name]["batch"], CASES[name].get("lr", 0.02)
    state = _transfer_state(model, seed=3)
    trainable = resolve_trainable(model, policy)
    assert frozen_statistics_layers(model, trainable)
    opt = OptimizerConfig("sgd", lr=lr, momentum=0.9, weight_decay=1e-4)
    step = CompiledStep(device, model, batch, state, trainable=trainable, optimizer=opt,
                        poison=True, poison_freed=True)
    step.plan.check_no_live_overlap()
    masks = [t for t in step.graph.tensors if t.endswith(":mask")]
    assert masks and all(step.graph.tensors[t].dtype == np.uint8 for t in masks)
    ref = ReferenceTrainer(model, state, optimizer="sgd", lr=lr, momentum=0.9, weight_decay=1e-4,
                           trainable=trainable)
    xs, ys = _batches(np.random.default_rng(7), model, batch, STEPS)
    ours, theirs = [], []
    for x, y in zip(xs, ys, strict=True):
        step.train_step(x, y)
        ours.append(step.read_train_stats()["loss"])
        theirs.append(ref.train_step(x, y))
    np.testing.assert_allclose(ours, theirs, rtol=1e-3)
    final = step.get_state()
    for key, value in ref.state.items():
        np.testing.assert_allclose(final[key], value, rtol=2e-3, atol=2e-4, err_msg=key)
        if key.endswith(("running_mean", "running_var")) or key not in trainable:
            np.testing.assert_array_equal(final[key], state[key], err_msg=key)
    assert not np.allclose(final[sorted(trainable)[-1]], state[sorted(trainable)[-1]])


@pytest.mark.parametrize("policy", ["bias", "bias+norm", "all"])
def test_memory_estimate_equals_the_compiled_arena_under_tinytl(device, policy):
    model = _model("dscnn")
    trainable = resolve_trainable(model, policy)
    step = CompiledStep(device, model, 6, model.init_state(0), trainable=trainable)
    estimate = estimate_memory(model, 6, trainable, alignment=step.plan.alignment)
    assert estimate.peak_bytes == step.peak_bytes == step.arena.size


def test_bias_training_needs_at_least_five_times_less_memory_than_full_training():
    """The TinyTL goal at batch 32 (DS-CNN on FSDD's 40x40, MobileNetV2-0.35 on 32x32)."""
    models = [
        build_model("dscnn", input_shape=(1, 40, 40), num_classes=10),
        build_model("mobilenetv2"),
    ]
    for model in models:
        full = estimate_memory(model, 32).peak_bytes
        bias = estimate_memory(model, 32, resolve_trainable(model, "bias")).peak_bytes
        print(f"{model.name}: all {full / 2**20:.1f} MiB, bias {bias / 2**20:.1f} MiB")
        assert bias * 5 <= full, (model.name, full, bias)


def test_one_update_launch_per_step_replaces_one_per_parameter(device):
    from kernels.optimizer import UPDATE_KERNELS

    model = build_model("lenet5")
    state = model.init_state(0)
    fused = CompiledStep(device, model, 4, state, profile=False)
    separate = CompiledStep(device, model, 4, state, profile=False, fused_update=False)

    def updates(step):
        return [launch.name for launch in step.train_launches if launch.name in UPDATE_KERNELS]

    trainable = len(model.parameter_shapes())
    assert updates(fused) == ["sgd_momentum_multi"]
    assert updates(separate) == ["sgd_momentum"] * trainable
    assert fused.launches_per_step() == separate.launches_per_step() - (trainable - 1)
    estimate = estimate_memory(model, 4, alignment=fused.plan.alignment)
    assert estimate.peak_bytes == fused.peak_bytes == fused.arena.size


@pytest.mark.parametrize("optimizer", ["sgd", "nesterov", "adam"])
@pytest.mark.parametrize(
    "options",
    [{"policy": "all"}, {"policy": "last:2"}, {"policy": "all", "accumulation_steps": 2},
     {"policy": "all", "recompute_segments": 2}],
)
def test_one_launch_update_matches_per_parameter_updates(device, optimizer, options):
    """Same arithmetic per element, in another order of launches: the trajectories agree to
    float32 rounding, under micro-batching, recomputation and a learning-rate change too."""
    model = _model("lenet5")
    state = model.init_state(seed=4)
    opt = {
        "sgd": OptimizerConfig("sgd", lr=0.03, momentum=0.0, weight_decay=1e-3),
        "nesterov": OptimizerConfig("sgd", lr=0.03, momentum=0.9, nesterov=True),
        "adam": OptimizerConfig("adam", lr=1e-3, weight_decay=1e-4),
    }[optimizer]
    options = dict(options)
    trainable = resolve_trainable(model, options.pop("policy"))
    steps = [
        CompiledStep(device, model, 6, state, trainable=trainable, optimizer=opt, poison=True,
                     poison_freed=True, fused_update=fused, **options)
        for fused in (True, False)
    ]
    xs, ys = _batches(np.random.default_rng(5), model, 6, 4)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i == 2:
            for step in steps:
                step.set_learning_rate(opt.lr / 3)
        losses = []
        for step in steps:
            step.train_step(x, y)
            losses.append(step.read_train_stats()["loss"])
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    got, expected = (step.get_state() for step in steps)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for name in model.parameter_shapes():
        if name not in trainable:
            np.testing.assert_array_equal(got[name], state[name])
    estimate = estimate_memory(model, 6 // options.get("accumulation_steps", 1), trainable, opt,
                               alignment=steps[0].plan.alignment,
                               accumulate_gradients="accumulation_steps" in options,
                               recompute_segments=options.get("recompute_segments", 0))
    assert estimate.peak_bytes == steps[0].peak_bytes == steps[0].arena.size
