"""Round listeners: code in the server's process (the progress display of ``mgfl simulate``)
that wants to hear of each finished round, without the ServerApp knowing who listens."""

from __future__ import annotations

import threading
from collections.abc import Callable

RoundListener = Callable[[dict], None]

_listeners: list[RoundListener] = []
_lock = threading.Lock()


def add_round_listener(listener: RoundListener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_round_listener(listener: RoundListener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def announce_round(record: dict) -> None:
    """Calls every listener with the round's record; a failing listener cannot stop the run."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(record)
        except Exception as err:  # noqa: BLE001 - a display must not end a federated run
            from logging import WARNING

            from flwr.supercore import log

            log(WARNING, "round listener %r failed: %s", listener, err)
