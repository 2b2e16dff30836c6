"""The simulated fleet: profile draws, synthetic uplinks, FedScale-style first-K selection with a
deadline, and the simulated clock."""

from __future__ import annotations

import pytest

from mgfl.device_profiles import PROFILES
from mgfl.fleet import (
    ClientTime,
    SimulatedClock,
    first_to_finish,
    needed_clients,
    profile_for,
    uplink_bits_per_second,
)


def test_mix_is_seeded_and_covers_several_gpus():
    draws = [profile_for("mix", c, seed=1).name for c in range(60)]
    assert draws == [profile_for("mix", c, seed=1).name for c in range(60)]
    assert len(set(draws)) >= 6 and set(draws) <= set(PROFILES)


def test_named_profile_for_everyone_and_unknown_name():
    assert {profile_for("Mali-G78", c).name for c in range(5)} == {"mali-g78"}
    with pytest.raises(ValueError):
        profile_for("adreno-1", 0)


def test_uplinks_spread_around_the_median():
    rates = sorted(uplink_bits_per_second(c, 10.0) for c in range(401))
    assert 5e6 < rates[200] < 20e6  # the sample median near 10 Mbit/s
    assert rates[0] < 5e6 < 20e6 < rates[-1]
    with pytest.raises(ValueError):
        uplink_bits_per_second(0, 0.0)


def _times(*totals: float) -> list[ClientTime]:
    return [ClientTime(i, "p", t * 0.75, t * 0.25) for i, t in enumerate(totals)]


def test_over_selection_keeps_the_first_to_finish():
    assert needed_clients(13, 1.3) == 10
    assert needed_clients(4, 1.0) == 4
    outcome = first_to_finish(_times(5.0, 1.0, 9.0, 3.0, 2.0), needed=3)
    assert outcome.kept == (1, 4, 3)
    assert outcome.stragglers == (0, 2)
    assert outcome.round_s == pytest.approx(3.0)


def test_deadline_drops_late_clients_and_bounds_the_round():
    outcome = first_to_finish(_times(5.0, 1.0, 9.0, 3.0), needed=3, deadline_s=4.0)
    assert outcome.kept == (1, 3)
    assert outcome.stragglers == (0, 2)
    assert outcome.round_s == pytest.approx(4.0)  # fewer than needed: the round waits it out
    with pytest.raises(ValueError):
        needed_clients(4, 0.5)


def test_clock_adds_round_durations():
    clock = SimulatedClock()
    clock.advance(1, first_to_finish(_times(2.0, 4.0), needed=1))
    record = clock.advance(2, first_to_finish(_times(3.0, 1.0), needed=2))
    assert clock.seconds == pytest.approx(5.0)
    assert record == {"round": 2, "round_s": 3.0, "wall_clock_s": 5.0, "kept": [1, 0],
                      "stragglers": []}
