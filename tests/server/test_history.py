"""The run history: a JSON file rewritten every round, and listeners told of each round."""

from __future__ import annotations

import json

from server.events import add_round_listener, remove_round_listener
from server.history import RoundRecord, RunHistory


def test_history_file_and_listeners(tmp_path):
    heard = []

    def broken(_record):
        raise RuntimeError("a display that fails")

    add_round_listener(heard.append)
    add_round_listener(broken)
    try:
        history = RunHistory(tmp_path / "out" / "history.json", {"config": {"codec": "none"}})
        history.add(RoundRecord(round=0, accuracy=0.1, loss=float("nan"), uplink_bytes=0,
                                downlink_bytes=0))
        history.add(RoundRecord(round=1, accuracy=0.5, loss=1.2, uplink_bytes=100,
                                downlink_bytes=300, clients=3))
        history.add(RoundRecord(round=2, accuracy=0.7, loss=0.9, uplink_bytes=50,
                                downlink_bytes=300, clients=3))
    finally:
        remove_round_listener(heard.append)
        remove_round_listener(broken)
    stored = json.loads((tmp_path / "out" / "history.json").read_text())
    assert [r["round"] for r in stored["rounds"]] == [0, 1, 2]
    assert stored["rounds"][0]["loss"] is None
    assert stored["final_accuracy"] == 0.7
    assert stored["initial_accuracy"] == 0.1
    assert stored["total_uplink_bytes"] == 150
    assert stored["total_downlink_bytes"] == 600
    assert stored["run"]["config"]["codec"] == "none"
    assert [r["round"] for r in heard] == [0, 1, 2]
    assert {"round", "accuracy", "loss", "uplink_bytes", "downlink_bytes"} <= set(heard[1])
