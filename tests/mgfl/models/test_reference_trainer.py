"""The float64 reference trainer: exact gradients, optimizer rules, BatchNorm, dropout, freezing."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.models import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    Model,
    ReferenceTrainer,
    ReLU,
    ReLU6,
    Residual,
    build_model,
    dropout_seed,
)
from mgfl.models.reference_ops import softmax_cross_entropy
from tests.kernels.conftest import assert_close, numeric_grad

# A bias right before a BatchNorm gets no gradient at all (the batch mean removes it), and so
# does any per-channel shift that reaches a BatchNorm through shift-preserving layers only; the
# layers are arranged so that every parameter here has a gradient to check.
BODY = (
    Conv2d(4, 3, stride=2, padding=1, bias=False),
    BatchNorm(),
    ReLU6(),
    Residual((DepthwiseConv2d(3, padding=1), ReLU(), Conv2d(4, 1))),
    ReLU(),
    MaxPool2d(3, stride=1, padding=1),
    AvgPool2d(2, stride=2, padding=1),
)
HEADS = {
    "flatten": (Flatten(), Linear(6, bias=False), BatchNorm(), ReLU(), Dropout(0.3), Linear(5)),
    "global_pool": (GlobalAvgPool(), Flatten(), Dropout(0.3), Linear(5)),
}


def _every_layer_model(head: str) -> Model:
    return Model(f"every-layer-{head}", (2, 9, 9), BODY + HEADS[head])


def _batch(rng, model: Model, n: int):
    x = rng.normal(size=(n, *model.input_shape))
    return x, rng.integers(0, model.num_classes, n)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_gradients_match_central_finite_differences(rng, head):
    pytest.importorskip("kernels.reference.dropout")
    model = _every_layer_model(head)
    state = model.init_state(5)
    state["layers.1.weight"][:] = 4.0  # spread the activations so that ReLU6 also caps at 6
    trainer = ReferenceTrainer(model, state)
    x, y = _batch(rng, model, 3)
    trainer.step = 4  # any step: the dropout mask is fixed by (path, step)
    _, grads = trainer.loss_and_grads(x, y)
    assert set(grads) == set(model.parameter_shapes())

    conv_out = trainer.forward(x, training=True)
    assert conv_out.shape == (3, 5)
    capped = _first_relu6_output(trainer, x)
    assert np.any(capped == 6.0) and np.any((capped > 0) & (capped < 6))

    for name in model.parameter_shapes():
        original = trainer.state[name].copy()

        def loss(value, name=name):
            trainer.state[name] = value
            return softmax_cross_entropy(trainer.forward(x, training=True), y)[0]

        numeric = numeric_grad(loss, original)
        trainer.state[name] = original
        assert np.max(np.abs(numeric)) > 1e-4, f"{name} has no gradient to check"
        assert_close(grads[name], numeric, rtol=1e-5)


def _first_relu6_output(trainer: ReferenceTrainer, x: np.ndarray) -> np.ndarray:
    from mgfl.models import reference_layers

    h = x
    for entry in trainer.layers[:3]:
        h, _ = reference_layers.forward(entry, h, trainer.state, True, trainer.step)
    return h


def test_dropout_uses_the_hash_mask_of_the_whole_batch_and_the_step():
    dropout = pytest.importorskip("kernels.reference.dropout")
    p = 0.4
    model = Model("drop", (2, 3, 5), (Flatten(), Dropout(p), Linear(3)))
    state = model.init_state(0)
    state["layers.2.weight"][:] = np.eye(3, 30)
    state["layers.2.bias"][:] = 0
    trainer = ReferenceTrainer(model, state, lr=0.0)
    x = np.arange(1, 4 * 30 + 1, dtype=np.float64).reshape(4, 2, 3, 5)
    y = np.zeros(4, dtype=np.int64)
    for step in (1, 2):
        assert trainer.step == step
        keep = dropout.dropout_mask(4 * 30, p, dropout_seed("layers.1"), step).reshape(4, 30)
        expected = np.where(keep, x.reshape(4, 30) / (1 - p), 0.0)[:, :3]
        np.testing.assert_allclose(trainer.forward(x, training=True), expected, rtol=1e-15)
        trainer.train_step(x, y)
    assert not np.array_equal(
        dropout.dropout_mask(120, p, dropout_seed("layers.1"), 1),
        dropout.dropout_mask(120, p, dropout_seed("layers.1"), 2),
    )
    np.testing.assert_allclose(trainer.forward(x, training=False), x.reshape(4, 30)[:, :3])


def test_batchnorm_running_statistics_and_evaluation_mode(rng):
    model = Model("bn", (3, 4, 5), (BatchNorm(momentum=0.2), GlobalAvgPool()))
    trainer = ReferenceTrainer(model, model.init_state(0), lr=0.0)
    x = rng.normal(1.5, 2.0, size=(6, 3, 4, 5))
    trainer.train_step(x, rng.integers(0, 3, 6))
    mean = x.mean(axis=(0, 2, 3))
    unbiased = x.var(axis=(0, 2, 3), ddof=1)
    assert_close(trainer.state["layers.0.running_mean"], 0.2 * mean, rtol=1e-12)
    assert_close(trainer.state["layers.0.running_var"], 0.8 + 0.2 * unbiased, rtol=1e-12)
    rm, rv = trainer.state["layers.0.running_mean"], trainer.state["layers.0.running_var"]
    expected = ((x - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5)).mean(axis=(2, 3))
    assert_close(trainer.forward(x, training=False), expected, rtol=1e-12)
    train_mode = trainer.forward(x, training=True)
    assert np.allclose(train_mode.mean(axis=0), 0.0, atol=1e-12)


def test_forward_and_loss_and_grads_change_nothing(rng):
    model = _every_layer_model("flatten")
    trainer = ReferenceTrainer(model, model.init_state(1))
    before = {k: v.copy() for k, v in trainer.state.items()}
    x, y = _batch(rng, model, 4)
    trainer.forward(x, training=True)
    trainer.loss_and_grads(x, y)
    trainer.evaluate(x, y)
    assert trainer.step == 1
    for name, value in before.items():
        np.testing.assert_array_equal(trainer.state[name], value)


def test_train_step_returns_the_loss_before_the_update(rng):
    model = build_model("lenet5")
    trainer = ReferenceTrainer(model, model.init_state(0), lr=0.1)
    x, y = _batch(rng, model, 4)
    expected, _ = trainer.loss_and_grads(x, y)
    assert trainer.train_step(x, y) == expected
    assert trainer.step == 2
    assert trainer.loss_and_grads(x, y)[0] < expected


def _linear_trainer(rng, **options):
    model = Model("linear", (3,), (Linear(4),))
    return ReferenceTrainer(model, model.init_state(2), **options), rng.normal(size=(5, 3))


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_follows_pytorch(rng, nesterov):
    lr, momentum, wd = 0.1, 0.8, 0.01
    trainer, x = _linear_trainer(rng, lr=lr, momentum=momentum, weight_decay=wd, nesterov=nesterov)
    y = rng.integers(0, 4, 5)
    params = {k: v.copy() for k, v in trainer.state.items()}
    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    for _ in range(3):
        _, grads = trainer.loss_and_grads(x, y)
        for name, p in params.items():
            g = grads[name] + wd * p
            velocity[name] = momentum * velocity[name] + g
            p -= lr * (g + momentum * velocity[name] if nesterov else velocity[name])
        trainer.train_step(x, y)
        for name, p in params.items():
            assert_close(trainer.state[name], p, rtol=1e-13)


def test_adam_follows_pytorch(rng):
    lr, (b1, b2), eps, wd = 0.05, (0.8, 0.99), 1e-6, 0.02
    trainer, x = _linear_trainer(
        rng, optimizer="adam", lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd
    )
    y = rng.integers(0, 4, 5)
    params = {k: v.copy() for k, v in trainer.state.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    for t in range(1, 4):
        _, grads = trainer.loss_and_grads(x, y)
        for name, p in params.items():
            g = grads[name] + wd * p
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g * g
            m_hat, v_hat = m[name] / (1 - b1**t), v[name] / (1 - b2**t)
            p -= lr * m_hat / (np.sqrt(v_hat) + eps)
        trainer.train_step(x, y)
        for name, p in params.items():
            assert_close(trainer.state[name], p, rtol=1e-12)


@pytest.mark.parametrize(("optimizer", "lr"), [("sgd", 0.05), ("adam", 0.01)])
def test_a_few_steps_reduce_the_loss(rng, optimizer, lr):
    model = build_model("cnn1d", input_shape=(6, 1, 32), num_classes=4)
    trainer = ReferenceTrainer(model, model.init_state(0), optimizer=optimizer, lr=lr)
    x, y = _batch(rng, model, 16)
    losses = [trainer.train_step(x, y) for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]
    loss, accuracy = trainer.evaluate(x, y)
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0


def test_frozen_parameters_stay_while_running_statistics_move(rng):
    model = build_model("dscnn", input_shape=(1, 12, 6), channels=8, num_classes=3)
    frozen_layers = {r.path for r in model.resolve()[:2]}  # first conv and its BatchNorm
    trainable = {n for n in model.parameter_shapes() if n.rsplit(".", 1)[0] not in frozen_layers}
    trainer = ReferenceTrainer(model, model.init_state(0), trainable=trainable, weight_decay=0.1)
    before = {k: v.copy() for k, v in trainer.state.items()}
    x, y = _batch(rng, model, 4)
    for _ in range(3):
        trainer.train_step(x, y)
    for name in model.parameter_shapes():
        changed = not np.array_equal(trainer.state[name], before[name])
        assert changed == (name in trainable), name
    assert not np.array_equal(
        trainer.state["layers.1.running_mean"], before["layers.1.running_mean"]
    )


def test_evaluate_reports_mean_loss_and_accuracy(rng):
    model = build_model("mlp", input_shape=(1, 4, 4), hidden=(8,), num_classes=3)
    trainer = ReferenceTrainer(model, model.init_state(0))
    x = rng.normal(size=(300, 1, 4, 4))
    logits = trainer.forward(x, training=False)
    y = logits.argmax(axis=1)
    y[:30] = (y[:30] + 1) % 3
    loss, accuracy = trainer.evaluate(x, y)
    assert accuracy == pytest.approx(0.9)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    assert loss == pytest.approx(-log_probs[np.arange(300), y].mean(), rel=1e-12)


def test_invalid_inputs_are_clear_errors(rng):
    model = _every_layer_model("flatten")
    state = model.init_state(0)
    with pytest.raises(ValueError, match="missing"):
        ReferenceTrainer(model, {k: v for k, v in state.items() if k != "layers.1.bias"})
    with pytest.raises(ValueError, match="shape"):
        ReferenceTrainer(model, {**state, "layers.1.bias": np.zeros(5)})
    with pytest.raises(ValueError, match="trainable"):
        ReferenceTrainer(model, state, trainable={"layers.99.weight"})
    with pytest.raises(ValueError, match="Unknown optimizer"):
        ReferenceTrainer(model, state, optimizer="rmsprop")
    trainer = ReferenceTrainer(model, state)
    x, y = _batch(rng, model, 2)
    with pytest.raises(ValueError, match=r"\(N, 2, 9, 9\)"):
        trainer.train_step(x[:, :1], y)
    with pytest.raises(ValueError, match="Labels"):
        trainer.train_step(x, np.array([0, 5]))
    with pytest.raises(ValueError, match="more than one value per channel"):
        trainer.train_step(x[:1], y[:1])  # the BatchNorm on (F,) sees one value per feature


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [
        ("mlp", None),
        ("lenet5", None),
        ("dscnn", (1, 20, 8)),
        ("mobilenetv2", (3, 16, 16)),
        ("cnn1d", (6, 1, 24)),
    ],
)
def test_every_zoo_model_trains_every_parameter(rng, name, input_shape):
    model = build_model(name, input_shape=input_shape)
    trainer = ReferenceTrainer(model, model.init_state(0), lr=0.05)
    before = {k: v.copy() for k, v in trainer.state.items()}
    x, y = _batch(rng, model, 4)
    losses = [trainer.train_step(x, y) for _ in range(3)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    for param in model.parameter_shapes():
        assert not np.array_equal(trainer.state[param], before[param]), param
