"""Memory budgets: parsing, the largest fitting batch, micro-batches, recomputation, refusal."""

from __future__ import annotations

import pytest

from client_runtime.budget import (
    BudgetTooSmallError,
    choose_batch,
    fit_to_budget,
    largest_fitting_batch,
    parse_bytes,
    staging_bytes,
)
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep, estimate_memory
from client_runtime.trainer import TrainConfig, compile_within_budget
from mgfl.models import build_model


def test_parse_bytes():
    assert parse_bytes("256MB") == 256 * 2**20
    assert parse_bytes("1.5 GiB") == int(1.5 * 2**30)
    assert parse_bytes("4096") == 4096
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes("lots")


def test_largest_fitting_batch_is_exact():
    peak = lambda b: 1000 + 37 * b  # noqa: E731
    assert largest_fitting_batch(peak, 1000 + 37 * 50, 4096) == 50
    assert largest_fitting_batch(peak, 999, 4096) == 0


def test_batch_is_split_into_equal_micro_batches():
    choice = choose_batch(lambda b: 100 * b, requested=48, budget=1700)
    assert choice.micro_batch == 16 and choice.accumulation_steps == 3
    assert choice.effective_batch == 48


def test_too_small_budget_names_the_smallest_that_works():
    model = build_model("dscnn")
    trainable = set(model.parameter_shapes())
    with pytest.raises(BudgetTooSmallError, match="at least") as err:
        fit_to_budget(model, 32, trainable, OptimizerConfig(), budget=10_000)
    assert "batch 1" in str(err.value)


def test_recomputation_is_used_when_one_sample_does_not_fit():
    model = build_model("mobilenetv2", input_shape=(3, 32, 32))
    trainable, opt = set(model.parameter_shapes()), OptimizerConfig()
    one = estimate_memory(model, 1, trainable, opt, accumulate_gradients=True).peak_bytes
    budget = one + staging_bytes(model, 1) - 1024  # just short of batch 1 without recomputation
    choice = fit_to_budget(model, 8, trainable, opt, budget)
    assert choice.recompute_segments > 0
    assert choice.peak_bytes <= budget


@pytest.mark.parametrize("budget_mb", [2, 4, 16])
def test_real_allocations_stay_within_the_budget(device, budget_mb):
    """The device buffers a step allocates (the arena and the staging slots, as OpenCL reports
    their sizes) never exceed the budget, whatever the requested batch."""
    model = build_model("dscnn", input_shape=(1, 40, 40), num_classes=10)
    budget = budget_mb * 2**20
    config = TrainConfig(batch=64, memory_budget=budget)
    step = compile_within_budget(device, model, config, model.init_state(0), None, None)
    allocated = step.arena.size + sum(slot.size for slot in step.staging.slots)
    assert allocated <= budget
    assert step.micro_batch * step.accumulation_steps == 64
    assert isinstance(step, CompiledStep)
