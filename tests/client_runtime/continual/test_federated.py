"""Federated class-incremental rounds in simulation: staggered task arrival, a growing global
head, and exemplar memories that persist in each client's own state and never travel."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from client_runtime.continual.federated import client_round
from mgfl import continual_federation as cf
from mgfl.data.registry import load_dataset
from mgfl.models import build_model
from server.continual import round_message
from server.continual_simulation import simulate


@pytest.fixture(scope="module")
def data():
    return load_dataset("fsdd").subset(train=480, test=80, classes=range(4), seed=1)


CONFIG = cf.FederatedIncrementalConfig(
    num_clients=2, tasks=2, classes_per_task=2, rounds_per_task=2, stagger=1, memory=20,
    epochs=1, batch=16, eval_batch=40,
)  # fmt: skip


def test_schedule_staggers_task_arrival():
    assert [CONFIG.task_of(0, r) for r in range(1, 6)] == [0, 0, 1, 1, 1]
    assert [CONFIG.task_of(1, r) for r in range(1, 6)] == [0, 0, 0, 1, 1]
    assert CONFIG.num_rounds == 5


def test_simulation_grows_the_head_and_keeps_memories_on_clients(device, data):
    result = simulate(CONFIG, device, data)
    history = result["history"]
    assert [h["global_classes"] for h in history] == [2, 2, 4, 4, 4]
    round3 = history[2]["clients"]
    assert [c["task"] for c in round3] == [1, 0]  # client 1 meets the new classes a round later
    assert [c["exemplars"] for c in round3] == [20, 0]
    assert [c["exemplars"] for c in history[-1]["clients"]] == [20, 20]
    assert result["exemplar_bytes"] == 2 * 20 * (1600 + 4)  # int8 with a scale per exemplar
    assert len(result["accuracy_matrix"]) == 2 and result["accuracy_matrix"][0][1] is None
    assert history[-1]["accuracy_per_task"][0] > 0.3  # old classes are not wiped out


def test_exemplars_stay_in_the_client_state(device, data):
    model = build_model("mlp", input_shape=data.input_shape, num_classes=2)
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    state = model.init_state(0)
    x, y = data.x_train[:200], data.y_train[:200]
    reply = None
    for server_round in (1, 2, 3):
        message = round_message(state, server_round, CONFIG)
        reply = client_round(message, context, device, model, x, y, CONFIG, client=0)
        state = {k: v.numpy() for k, v in reply[cf.REPLY_KEY].items()}
        model = build_model("mlp", input_shape=data.input_shape, num_classes=len(
            state["layers.5.bias"]))  # fmt: skip
    memory = context.state[cf.CLIENT_STATE_EXEMPLARS]
    assert sorted(memory.keys()) == ["0:data", "0:scales", "1:data", "1:scales"]
    assert memory["0:data"].numpy().dtype == np.int8
    assert set(reply.keys()) == {cf.REPLY_KEY, cf.METRICS_KEY}
    assert set(reply[cf.REPLY_KEY].keys()) == set(model.parameter_shapes())
    assert context.state[cf.CLIENT_STATE_META]["tasks-done"] == 1


def test_the_flower_apps_run_on_flowers_simulation_engine(tmp_path):
    from server.continual_simulation import simulate_with_flower

    config = cf.FederatedIncrementalConfig(
        num_clients=2, tasks=2, rounds_per_task=1, stagger=0, memory=10, epochs=1,
        output=str(tmp_path / "fcl.json"),
    )  # fmt: skip
    result = simulate_with_flower(config)
    assert [h["global_classes"] for h in result["history"]] == [2, 4]
    assert [c["exemplars"] for c in result["history"][-1]["clients"]] == [10, 10]
    assert [c["client"] for c in result["history"][-1]["clients"]] == [0, 1]
