"""A simulated fleet of phones: which GPU each client has, how fast its uplink is, how long its
round takes, and which clients a round keeps when it over-selects and has a deadline.

The round model is FedScale's (FACTS, "FedScale system-heterogeneity traces"): sample
``needed x over_selection`` clients, order them by completion time (local training plus upload of
the encoded update), keep the first ``needed`` that finish within the deadline; the others are the
round's stragglers, and the round lasts until the last kept client finishes (or the deadline when
fewer than ``needed`` make it). Uplink bandwidths are synthetic: lognormal around a median, as
FedScale suggests when its MobiPerf traces are not at hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mgfl.device_profiles import MIX, PROFILES, DeviceProfile, get_profile

UPLINK_SIGMA = 0.8  # lognormal spread of uplink bandwidths [judgement; synthetic]


def profile_for(devices: str, client: int, seed: int = 0) -> DeviceProfile:
    """``mix``: each client draws one of the profiled GPUs (seeded by client id); else the named
    profile for every client."""
    if devices.strip().lower() != "mix":
        return get_profile(devices)
    draw = np.random.default_rng([seed, client, 0x6D6978]).integers(len(MIX))
    return PROFILES[MIX[int(draw)]]


def uplink_bits_per_second(client: int, median_mbps: float, seed: int = 0) -> float:
    """A client's uplink bandwidth: lognormal around ``median_mbps`` (synthetic)."""
    if median_mbps <= 0:
        raise ValueError(f"uplink median must be positive, got {median_mbps} Mbit/s")
    rng = np.random.default_rng([seed, client, 0x75706C])
    return median_mbps * 1e6 * math.exp(UPLINK_SIGMA * rng.standard_normal())


@dataclass(frozen=True)
class ClientTime:
    """One client's simulated round: training then uploading."""

    client: int
    profile: str
    train_s: float
    uplink_s: float

    @property
    def total_s(self) -> float:
        return self.train_s + self.uplink_s


@dataclass(frozen=True)
class RoundOutcome:
    """Which selected clients a round keeps, and how long it lasts in simulated seconds."""

    kept: tuple[int, ...]
    stragglers: tuple[int, ...]
    round_s: float


def needed_clients(selected: int, over_selection: float) -> int:
    """How many of ``selected`` clients a round waits for when it over-selects by a factor."""
    if over_selection < 1.0:
        raise ValueError(f"over-selection must be at least 1.0, got {over_selection}")
    return max(1, math.ceil(selected / over_selection - 1e-9))


def first_to_finish(times: list[ClientTime], needed: int, deadline_s: float = 0.0) -> RoundOutcome:
    """Keep the first ``needed`` clients to finish, none after ``deadline_s`` (0: no deadline)."""
    ordered = sorted(times, key=lambda t: (t.total_s, t.client))
    in_time = [t for t in ordered if deadline_s <= 0 or t.total_s <= deadline_s]
    kept = in_time[:needed]
    stragglers = [t.client for t in ordered if t not in kept]
    if len(kept) == needed and kept:
        round_s = kept[-1].total_s
    elif deadline_s > 0:
        round_s = deadline_s
    else:
        round_s = kept[-1].total_s if kept else 0.0
    return RoundOutcome(tuple(t.client for t in kept), tuple(stragglers), round_s)


class SimulatedClock:
    """Simulated wall-clock time of a run: the sum of its round durations."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.rounds: list[dict] = []

    def advance(self, server_round: int, outcome: RoundOutcome) -> dict:
        self.seconds += outcome.round_s
        record = {"round": server_round, "round_s": outcome.round_s,
                  "wall_clock_s": self.seconds, "kept": list(outcome.kept),
                  "stragglers": list(outcome.stragglers)}
        self.rounds.append(record)
        return record
