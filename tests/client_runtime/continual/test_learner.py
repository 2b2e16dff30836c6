"""Three tasks on a small slice of FSDD: the exemplar method keeps old classes, fine-tuning not."""

from __future__ import annotations

import numpy as np
import pytest

from client_runtime.continual import IncrementalConfig, IncrementalLearner
from mgfl.data.registry import load_dataset
from mgfl.models import build_model

TASKS = [[0, 1], [2, 3], [4, 5]]


@pytest.fixture(scope="module")
def data():
    full = load_dataset("fsdd")
    return full.subset(train=360, test=120, classes=range(6), seed=0)


def _run(device, data, **options):
    model = build_model("mlp", input_shape=data.input_shape, num_classes=2, hidden=(32,))
    config = IncrementalConfig(epochs=6, batch=16, eval_batch=64, memory=30, **options)
    learner = IncrementalLearner(device, model, config)
    for labels in TASKS:
        mask = np.isin(data.y_train, labels)
        report = learner.learn(data.x_train[mask], data.y_train[mask])
        assert report.classes == labels
    return learner, learner.accuracy_per_task(data.x_test, data.y_test, TASKS)


def test_icarl_beats_finetuning_on_old_classes(device, data):
    icarl, ours = _run(device, data, method="icarl")
    _, finetuned = _run(device, data, method="finetune")
    old_ours, old_finetuned = np.mean(ours[:2]), np.mean(finetuned[:2])
    assert old_finetuned < 0.2  # the new head rows take over
    assert old_ours > old_finetuned + 0.3
    assert icarl.memory.counts() == {c: 5 for c in range(6)}
    assert icarl.reports[-1].replayed_samples == 4 * 7  # 30 // 4 per class before task 3
    nme = icarl.accuracy_per_task(data.x_test, data.y_test, TASKS, classifier="nme")
    assert np.mean(nme[:2]) > old_finetuned + 0.2


def test_a_task_must_bring_the_next_labels(device, data):
    model = build_model("mlp", input_shape=data.input_shape, num_classes=2, hidden=(8,))
    learner = IncrementalLearner(device, model, IncrementalConfig(epochs=1, batch=16))
    mask = np.isin(data.y_train, [2, 3])
    with pytest.raises(ValueError, match="next labels"):
        learner.learn(data.x_train[mask], data.y_train[mask])


def test_nme_needs_exemplars():
    with pytest.raises(ValueError, match="icarl"):
        IncrementalConfig(method="finetune", classifier="nme")
