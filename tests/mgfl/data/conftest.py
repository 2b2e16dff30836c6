"""Where the test data lives, and the rule for optional sets: skip with the install hint on a
developer's machine, fail on CI (where the ``test`` extra must have installed them)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mgfl.data.errors import DatasetNotInstalledError

REPO_ROOT = Path(__file__).resolve().parents[3]
FSDD_DIR = REPO_ROOT.parent / "shared" / "data" / "fsdd"
FSDD_RECORDINGS = FSDD_DIR / "recordings"


def on_ci() -> bool:
    return bool(os.environ.get("CI"))


def optional(call, *args, **kwargs):
    """Runs ``call``; a missing optional set skips the test (saying how to install it), except
    on CI."""
    try:
        return call(*args, **kwargs)
    except DatasetNotInstalledError as err:
        if on_ci():
            raise
        pytest.skip(str(err))


def needs_spafe() -> None:
    from mgfl.data.audio_features import spafe_version

    optional(spafe_version)


@pytest.fixture(scope="session")
def fsdd_recordings() -> Path:
    if not FSDD_RECORDINGS.is_dir():
        message = f"the FSDD recordings are expected at {FSDD_RECORDINGS} (shared/ beside the repo)"
        if on_ci():
            pytest.fail(message)
        pytest.skip(message)
    return FSDD_RECORDINGS


SLICE_SPEAKERS = ("jackson", "theo")
SLICE_DIGITS = (3, 7)
SLICE_TAKES = (0, 1, 4, 5, 6, 49)


@pytest.fixture
def fsdd_slice(fsdd_recordings: Path, tmp_path: Path) -> Path:
    """2 speakers x 2 digits x 6 takes (3 test, 3 train) copied into a private directory."""
    target = tmp_path / "recordings"
    target.mkdir()
    for speaker in SLICE_SPEAKERS:
        for digit in SLICE_DIGITS:
            for take in SLICE_TAKES:
                name = f"{digit}_{speaker}_{take}.wav"
                shutil.copy2(fsdd_recordings / name, target / name)
    return target
