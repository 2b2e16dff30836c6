"""The run-config keys of a simulated fleet, and what a simulated phone reports."""

from __future__ import annotations

import pytest

from mgfl.device_profiles import PROFILES
from mgfl.run_config import RunConfig
from mgfl.simulated_phone import (
    FLEET_PROFILES,
    SimulatedPhone,
    check_devices,
    profile_index,
    profile_name,
)


def test_devices_accepts_mix_and_profile_names():
    for devices in ("mix", "MIX", "adreno-650", "Mali G78", "h200", ""):
        RunConfig.from_mapping({"devices": devices})
    config = RunConfig.from_mapping({"devices": "mix", "over-selection": 0.3,
                                     "round-deadline-s": 60.0, "uplink-mbps": 5})
    assert (config.over_selection, config.round_deadline_s, config.uplink_mbps) == (0.3, 60.0, 5.0)


def test_an_unknown_profile_is_refused_with_the_names():
    with pytest.raises(ValueError) as refused:
        RunConfig.from_mapping({"devices": "adreno-999"})
    message = str(refused.value)
    assert "adreno-999" in message and "mix" in message
    assert all(name in message for name in PROFILES)
    with pytest.raises(ValueError, match="mix"):
        check_devices("pixel")


@pytest.mark.parametrize("key, value", [("over-selection", -0.1), ("round-deadline-s", -1.0),
                                        ("uplink-mbps", 0.0)])
def test_fleet_numbers_out_of_range_are_refused(key, value):
    with pytest.raises(ValueError, match=key):
        RunConfig.from_mapping({"devices": "mix", key: value})


@pytest.mark.parametrize("key", ["over-selection", "round-deadline-s"])
def test_over_selection_and_deadline_need_simulated_devices(key):
    with pytest.raises(ValueError, match="set devices"):
        RunConfig.from_mapping({key: 0.5})


def test_profile_indices_round_trip():
    for name in FLEET_PROFILES:
        assert profile_name(profile_index(name)) == name
        assert profile_name(float(profile_index(name))) == name
    for bad in (-1, len(FLEET_PROFILES), 1.5):
        with pytest.raises(ValueError):
            profile_name(bad)


def test_uplink_seconds_follow_the_bytes_and_the_clients_link():
    phone = SimulatedPhone.of("adreno-640", 7, 8.0, seed=0)
    assert phone.profile.name == "adreno-640"
    assert phone.uplink_seconds(1_000_000) == pytest.approx(8e6 / phone.uplink_bits_per_second)
    assert phone.uplink_seconds(2_000_000) == pytest.approx(2 * phone.uplink_seconds(1_000_000))
    others = {SimulatedPhone.of("adreno-640", c, 8.0, seed=0).uplink_bits_per_second
              for c in range(8)}
    assert len(others) == 8  # every client has a link of its own
