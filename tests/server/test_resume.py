"""The server's state on disk: written atomically every round, read back without pickle, and a
real server process killed with SIGKILL mid-run continues from its last finished round."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAdam

from server.resume import (
    STATE_FILE,
    ServerState,
    check_same_run,
    load_state,
    restore_strategy_arrays,
    save_state,
    strategy_arrays_of,
)

REPO = Path(__file__).resolve().parents[2]


def adam_with_moments() -> FedAdam:
    strategy = FedAdam()
    strategy.m_t = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    strategy.v_t = {"w": np.full((2, 3), 0.5, np.float32)}
    return strategy


def test_state_round_trip_with_strategy_moments(tmp_path):
    global_state = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    saved = ServerState(4, global_state, strategy_arrays_of(adam_with_moments()),
                        {"model": "mlp"}, {"uplink": "topk:0.01", "downlink": "none"},
                        [{"round": r} for r in range(5)])
    save_state(tmp_path, saved)
    loaded = load_state(tmp_path)
    assert loaded.round == 4 and loaded.history == saved.history
    assert loaded.codecs == saved.codecs
    for name, value in global_state.items():
        np.testing.assert_array_equal(loaded.global_state[name], value)
    fresh = FedAdam()
    restore_strategy_arrays(fresh, loaded.strategy_arrays)
    np.testing.assert_array_equal(fresh.m_t["w"], adam_with_moments().m_t["w"])
    np.testing.assert_array_equal(fresh.v_t["w"], adam_with_moments().v_t["w"])


def test_each_round_replaces_the_previous_state_and_no_partial_file_stays(tmp_path):
    for server_round in range(3):
        save_state(tmp_path, ServerState(server_round, {"w": np.full(2, server_round, "f4")},
                                         {"momentum_vector": [np.ones(2, "f4")]}))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["server-state-002.npz", STATE_FILE]
    loaded = load_state(tmp_path)
    assert loaded.round == 2 and loaded.strategy_arrays["momentum_vector"][0].shape == (2,)
    with zipfile.ZipFile(tmp_path / "server-state-002.npz") as archive:
        for member in archive.namelist():  # plain .npy arrays: nothing an unpickler would run
            assert archive.read(member)[:6] == b"\x93NUMPY"


def test_no_state_means_a_fresh_start(tmp_path):
    assert load_state(tmp_path) is None


def test_another_run_may_not_continue_a_state():
    check_same_run({"model": "mlp", "num-rounds": 3}, {"model": "mlp", "num-rounds": 5,
                                                       "resume": 1})
    with pytest.raises(ValueError, match="model"):
        check_same_run({"model": "mlp"}, {"model": "dscnn"})


def test_unknown_strategy_state_is_refused():
    with pytest.raises(ValueError, match="momentum_vector"):
        restore_strategy_arrays(FedAdam(), {"momentum_vector": [np.zeros(1)]})


def simulate_command(out: Path, rounds: int) -> list[str]:
    return [sys.executable, "-m", "mgfl", "simulate", "--rounds", str(rounds),
            "--data", "synthetic:1,8,8:4", "--model", "mlp", "--batch", "16",
            "--local-steps", "10", "--partition", "iid", "--clients", "2",
            "--strategy", "fedadam", "-c", "eval-batch=64", "-c", "resume=1",
            "--output-dir", str(out), "--plot", str(out / "rounds.png")]


def saved_round(out: Path) -> int:
    try:
        return json.loads((out / STATE_FILE).read_text())["round"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


@pytest.mark.slow
def test_a_server_killed_mid_run_resumes_without_losing_or_repeating_rounds(device, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "MGFL_DEVICE": device.info.name}
    first = subprocess.Popen(simulate_command(out, 3), cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while saved_round(out) < 1 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, "the first run ended before it could be killed"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    killed_at = saved_round(out)
    assert 1 <= killed_at < 3
    before = {r["round"]: r for r in json.loads((out / STATE_FILE).read_text())["history"]}

    second = subprocess.run(simulate_command(out, 3), cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, start_new_session=True)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    history = json.loads((out / "history.json").read_text())
    assert [r["round"] for r in history["rounds"]] == [0, 1, 2, 3]
    for record in history["rounds"][: killed_at + 1]:  # finished rounds are kept, not redone
        assert record == before[record["round"]]
    assert saved_round(out) == 3
    state = load_state(out)
    assert set(state.strategy_arrays) == {"m_t", "v_t"}, "FedAdam's moments survive the restart"
