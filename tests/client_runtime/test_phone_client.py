"""A client of a simulated fleet: its phone's memory budget picks the batch, and its reply
reports the cost model's training seconds and the uplink seconds of its real encoded update."""

from __future__ import annotations

import pytest
from flwr.supercore.task_identity import TaskIdentity

from client_runtime import federated
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep, default_alignment, estimate_memory
from mgfl.cost_model import predict_step
from mgfl.device_profiles import PROFILES
from mgfl.fleet import profile_for, uplink_bits_per_second
from mgfl.run_config import RunConfig
from mgfl.simulated_phone import FLEET_PROFILES
from tests.client_runtime.test_app import SMALL, node_context, setup, train_message


@pytest.fixture(autouse=True)
def flower_identity(device):  # the device fixture sets a private program cache
    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 3, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


@pytest.mark.parametrize("devices, partition_id", [("mali-g78", 1), ("mix", 2), ("mix", 3)])
def test_reply_reports_the_phones_simulated_seconds(device, devices, partition_id):
    config, model, layout, initial = setup({**SMALL, "devices": devices, "uplink-mbps": 4.0,
                                            "seed": 5})
    reply = federated.train_round(train_message(config, layout, initial).content,
                                  node_context(partition_id))
    metrics = reply["metrics"]
    profile = profile_for(devices, partition_id, seed=5)
    assert FLEET_PROFILES[metrics["device-profile"]] == profile.name
    optimizer = OptimizerConfig(name=config.optimizer, lr=config.lr)
    same = CompiledStep(device, model, metrics["batch"], initial, set(layout.trainable),
                        optimizer, profile=False)
    expected = metrics["steps"] * predict_step(same, profile).total_s
    assert metrics["sim-train-s"] == pytest.approx(expected, rel=1e-9)
    assert metrics["sim-train-s"] > 0
    bits = uplink_bits_per_second(partition_id, 4.0, seed=5)
    assert metrics["sim-uplink-s"] == pytest.approx(8 * metrics["uplink-bytes"] / bits)


def test_no_devices_no_simulated_metrics():
    config, _, layout, initial = setup(SMALL)
    reply = federated.train_round(train_message(config, layout, initial).content,
                                  node_context())
    assert not {"sim-train-s", "sim-uplink-s", "device-profile"} & set(reply["metrics"])


def test_the_phones_budget_picks_the_batch_unless_one_is_given(device):
    config, model, layout, _ = setup({**SMALL, "devices": "mali-g76"})
    phone = federated.simulated_phone(config, 0)
    budget = PROFILES["mali-g76"].memory_budget_bytes
    assert federated.memory_budget_of(config, phone) == str(budget)
    optimizer = OptimizerConfig(name=config.optimizer, lr=config.lr)
    trainable = set(layout.trainable)
    huge = 2**21  # an MLP batch far beyond a 384 MiB phone budget
    batch = federated._batch_for(model, huge, huge, trainable, optimizer, device,
                                 federated.memory_budget_of(config, phone))
    align = default_alignment(device.info.mem_base_addr_align_bytes)

    def peak(b: int) -> int:
        return estimate_memory(model, b, trainable, optimizer, alignment=align).peak_bytes

    assert 1 < batch < huge
    assert peak(batch) <= budget < peak(batch + 1)
    explicit = RunConfig.from_mapping({**SMALL, "devices": "mali-g76", "memory-budget": "1GB"})
    assert federated.memory_budget_of(explicit, phone) == "1GB"
    assert federated.memory_budget_of(RunConfig.from_mapping(SMALL), None) == ""
