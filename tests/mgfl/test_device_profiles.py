"""Every phone profile is complete, positive, sourced, and findable by the names users type."""

from __future__ import annotations

import dataclasses

import pytest

from mgfl.device_profiles import H200, MIX, PROFILES, SOURCES, get_profile

EXPECTED = {
    "adreno-620", "adreno-630", "adreno-640", "adreno-650", "adreno-660", "adreno-730",
    "adreno-740", "adreno-750", "mali-g76", "mali-g78", "mali-g710", "mali-g610",
}


def test_the_issue_s_twelve_gpus_are_profiled():
    assert set(PROFILES) == EXPECTED
    assert set(MIX) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_is_complete_and_positive(name):
    profile = PROFILES[name]
    for field in dataclasses.fields(profile):
        value = getattr(profile, field.name)
        if isinstance(value, (int, float)):
            assert value > 0, f"{name}.{field.name} = {value}"
    assert 0 < profile.sustained_fraction <= 1
    assert profile.host_copy_bandwidth < profile.memory_bandwidth
    assert profile.sources and all(s in SOURCES for s in profile.sources)
    assert profile.memory_budget_bytes >= 256 * 2**20
    # phone GPUs of 2018-2024: between 100 GFLOPS and 5 TFLOPS, 10 and 100 GB/s
    assert 1e11 < profile.peak_flops < 5e12
    assert 1e10 < profile.memory_bandwidth < 1e11


def test_measured_sustained_fractions_are_used_where_published():
    assert PROFILES["adreno-660"].sustained_flops == pytest.approx(728e9)
    assert PROFILES["mali-g610"].sustained_flops == pytest.approx(532e9)
    assert PROFILES["adreno-660"].memory_bandwidth == pytest.approx(35e9)


def test_newer_adreno_generations_are_faster():
    order = ["adreno-640", "adreno-650", "adreno-660", "adreno-730", "adreno-740", "adreno-750"]
    peaks = [PROFILES[n].peak_flops for n in order]
    assert peaks == sorted(peaks)


@pytest.mark.parametrize("text", ["adreno-650", "Adreno 650", "ADRENO_650"])
def test_lookup_by_name(text):
    assert get_profile(text) is PROFILES["adreno-650"]


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ValueError, match="mali-g78"):
        get_profile("adreno-999")


def test_h200_reference_profile_and_dict_form():
    assert get_profile("h200") is H200
    row = PROFILES["mali-g78"].to_dict()
    assert row["peak_gflops"] == pytest.approx(1090)
    assert all(row["sources"])
