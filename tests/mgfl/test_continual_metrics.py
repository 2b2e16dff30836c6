"""Class-incremental metrics against matrices worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mgfl import continual_metrics as cm

NAN = math.nan
# R[i][j]: accuracy on task j after task i (upper triangle unused).
R = [
    [0.9, NAN, NAN],
    [0.6, 0.8, NAN],
    [0.5, 0.7, 0.9],
]


def test_accuracy_after_each_task_is_the_mean_over_seen_tasks():
    assert cm.accuracy_after_each_task(R) == pytest.approx([0.9, 0.7, 0.7])


def test_final_and_average_incremental_accuracy():
    assert cm.final_accuracy(R) == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert cm.average_incremental_accuracy(R) == pytest.approx((0.9 + 0.7 + 0.7) / 3)


def test_weighted_by_task_size():
    # task 0 has 30 test samples, tasks 1 and 2 have 10: A_1 = (0.6*30 + 0.8*10) / 40 = 0.65
    after = cm.accuracy_after_each_task(R, task_sizes=[30, 10, 10])
    assert after == pytest.approx([0.9, 0.65, (0.5 * 30 + 0.7 * 10 + 0.9 * 10) / 50])


def test_forgetting_takes_the_best_earlier_accuracy():
    # task 0: max(0.9, 0.6) - 0.5 = 0.4; task 1: max(0.8) - 0.7 = 0.1
    assert cm.forgetting(R) == pytest.approx(0.25)
    rising = [[0.5, NAN, NAN], [0.8, 0.6, NAN], [0.7, 0.6, 0.9]]
    # task 0: max(0.5, 0.8) - 0.7 = 0.1 (not 0.5 - 0.7 from the diagonal); task 1: 0.0
    assert cm.forgetting(rising) == pytest.approx(0.05)


def test_backward_transfer_compares_with_the_diagonal():
    assert cm.backward_transfer(R) == pytest.approx(((0.5 - 0.9) + (0.7 - 0.8)) / 2)
    improving = [[0.5, NAN], [0.7, 0.9]]
    assert cm.backward_transfer(improving) == pytest.approx(0.2)
    assert cm.forgetting(improving) == pytest.approx(-0.2)


def test_one_task_has_no_forgetting():
    assert cm.forgetting([[0.8]]) == 0.0 and cm.backward_transfer([[0.8]]) == 0.0
    assert cm.final_accuracy([[0.8]]) == pytest.approx(0.8)


def test_summary_hides_the_upper_triangle():
    summary = cm.summarize(np.array(R))
    assert summary["accuracy_matrix"][0] == [0.9, None, None]
    assert summary["final_accuracy"] == pytest.approx(0.7)


@pytest.mark.parametrize("bad", [[[0.5, 0.2]], [], [[NAN]], [[0.5, NAN], [NAN, 0.5]]])
def test_malformed_matrices_are_refused(bad):
    with pytest.raises(ValueError):
        cm.final_accuracy(bad)


def test_task_sizes_must_match():
    with pytest.raises(ValueError, match="task_sizes"):
        cm.accuracy_after_each_task(R, task_sizes=[1, 2])
