"""The Free Spoken Digit Dataset read from a directory of its WAV files
(``{digit}_{speaker}_{take}.wav``, 8 kHz mono): official split, speakers, cached features."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mgfl.data.audio_features import AudioFeatureOptions, clip_features, spafe_version
from mgfl.data.dataset import Dataset
from mgfl.data.feature_cache import cache_key, feature_cache_path, load_cached, store
from mgfl.data.wav import read_wav

Progress = Callable[[int, int], None]
"""Called as ``progress(done, total)`` while a long job runs, e.g. to drive a progress bar."""

FSDD_CLASSES = [str(digit) for digit in range(10)]
FIRST_TRAIN_TAKE = 5  # takes 0-4 of every speaker and digit are the official test set
FEATURE_CODE_VERSION = 1  # bump when clip_features changes its output for the same options

FSDD_ATTRIBUTION = (
    "Free Spoken Digit Dataset (FSDD) by Zohar Jackson, César Souza, Jason Flaks, Yuxin Pan, "
    "Hereman Nicolas and Adhish Thite (Jakobovski/free-spoken-digit-dataset, "
    "doi:10.5281/zenodo.1342401), licensed under Creative Commons Attribution-ShareAlike 4.0 "
    "International (CC BY-SA 4.0, https://creativecommons.org/licenses/by-sa/4.0/). "
    "Features computed from it are shared under the same license."
)

_CLIP_NAME = re.compile(r"^(?P<digit>\d)_(?P<speaker>[A-Za-z0-9-]+)_(?P<take>\d+)\.wav$")


@dataclass(frozen=True)
class FsddClip:
    """One recording, with what its file name says about it."""

    path: Path
    digit: int
    speaker: str
    take: int

    @property
    def is_test(self) -> bool:
        return self.take < FIRST_TRAIN_TAKE


def parse_clip(path: Path) -> FsddClip | None:
    """The clip a file name describes, or None for a file that is not an FSDD recording."""
    match = _CLIP_NAME.match(path.name)
    if match is None:
        return None
    return FsddClip(path, int(match["digit"]), match["speaker"], int(match["take"]))


def find_clips(directory: Path) -> list[FsddClip]:
    """Every recording in ``directory`` (or in its ``recordings/`` folder, as FSDD is laid out),
    ordered by speaker, digit and take."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"no FSDD recordings directory at {directory}")
    if not any(directory.glob("*.wav")) and (directory / "recordings").is_dir():
        directory = directory / "recordings"
    clips = [clip for path in directory.glob("*.wav") if (clip := parse_clip(path))]
    if not clips:
        raise FileNotFoundError(
            f"no FSDD recordings ({{digit}}_{{speaker}}_{{take}}.wav) in {directory}"
        )
    return sorted(clips, key=lambda c: (c.speaker, c.digit, c.take))


def clip_feature_matrix(
    clips: Sequence[FsddClip],
    options: AudioFeatureOptions,
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> tuple[np.ndarray, Path, bool]:
    """Features of every clip, ``(N, frames, coefficients)``, with the cache file and whether it
    was a hit. The cache key covers the options, spafe's version and the file list."""
    parameters = {
        "options": options.to_dict(),
        "spafe": spafe_version(),
        "code": FEATURE_CODE_VERSION,
    }
    key = cache_key(parameters, [clip.path for clip in clips])
    path = feature_cache_path(cache_dir, f"fsdd-{options.kind}", key)
    cached = load_cached(path)
    if cached is not None and cached["features"].shape[0] == len(clips):
        return cached["features"], path, True
    features = np.empty((len(clips), options.frames, options.coefficients), dtype=np.float32)
    for i, clip in enumerate(clips):
        signal, rate = read_wav(clip.path)
        features[i] = clip_features(signal, rate, options)
        if progress is not None:
            progress(i + 1, len(clips))
    store(path, features=features, names=np.array([clip.path.name for clip in clips]))
    return features, path, False


def fsdd_dataset(
    name: str,
    features: np.ndarray,
    digits: np.ndarray,
    speakers: np.ndarray,
    takes: np.ndarray,
    speaker_names: list[str],
) -> Dataset:
    """Splits per-clip features by the official takes; inputs become (1, frames, coefficients)."""
    test = np.asarray(takes) < FIRST_TRAIN_TAKE
    x = np.asarray(features, dtype=np.float32)[:, None, :, :]
    return Dataset(
        name=name,
        x_train=x[~test],
        y_train=digits[~test],
        x_test=x[test],
        y_test=digits[test],
        groups_train=speakers[~test],
        groups_test=speakers[test],
        classes=list(FSDD_CLASSES),
        group_names=list(speaker_names),
        attribution=FSDD_ATTRIBUTION,
    )


def load_fsdd_recordings(
    directory: Path,
    *,
    options: AudioFeatureOptions | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> Dataset:
    """FSDD computed from WAV files; needs the ``audio`` extra unless the features are cached."""
    options = options or AudioFeatureOptions()
    clips = find_clips(Path(directory))
    features, _, _ = clip_feature_matrix(clips, options, cache_dir=cache_dir, progress=progress)
    speaker_names = sorted({clip.speaker for clip in clips})
    return fsdd_dataset(
        f"fsdd:{directory}",
        features,
        np.array([clip.digit for clip in clips]),
        np.array([speaker_names.index(clip.speaker) for clip in clips]),
        np.array([clip.take for clip in clips]),
        speaker_names,
    )
