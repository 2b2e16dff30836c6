"""The FSDD log-mel features that ship inside the package, so that training and the federated
simulation run on a fresh install with nothing downloaded and no audio library installed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mgfl.data.audio_features import AudioFeatureOptions
from mgfl.data.dataset import Dataset
from mgfl.data.fsdd import fsdd_dataset

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
EMBEDDED_FILE = EMBEDDED_DIR / "fsdd_logmel.npz"
EMBEDDED_OPTIONS = AudioFeatureOptions(kind="logmel", frames=40, mels=40)
LEVELS = 255  # log-mel values lie in [0, 1]; uint8 keeps them to within half a step of 1/255


def quantise_unit(values: np.ndarray) -> np.ndarray:
    """[0, 1] floats to uint8 codes, rounding to the nearest of 256 levels."""
    return np.rint(np.clip(values, 0.0, 1.0) * LEVELS).astype(np.uint8)


def dequantise_unit(codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.float32) / np.float32(LEVELS)


@dataclass(frozen=True)
class EmbeddedFsdd:
    """The stored arrays, one entry per clip, in (speaker, digit, take) order."""

    codes: np.ndarray  # uint8 (N, frames, mels)
    digits: np.ndarray
    speakers: np.ndarray  # index into speaker_names
    takes: np.ndarray
    names: list[str]  # the WAV file each entry was computed from
    speaker_names: list[str]
    options: AudioFeatureOptions

    @property
    def features(self) -> np.ndarray:
        return dequantise_unit(self.codes)


def read_embedded(path: Path = EMBEDDED_FILE) -> EmbeddedFsdd:
    if not path.is_file():
        raise FileNotFoundError(
            f"the embedded FSDD features are missing at {path}; rebuild them with "
            "`python -m mgfl.data.build_embedded /path/to/fsdd/recordings`"
        )
    with np.load(path, allow_pickle=False) as stored:
        return EmbeddedFsdd(
            codes=stored["codes"],
            digits=stored["digits"].astype(np.int32),
            speakers=stored["speakers"].astype(np.int32),
            takes=stored["takes"].astype(np.int32),
            names=[str(n) for n in stored["names"]],
            speaker_names=[str(n) for n in stored["speaker_names"]],
            options=AudioFeatureOptions(**json.loads(str(stored["options"]))),
        )


def load_fsdd_embedded(path: Path = EMBEDDED_FILE) -> Dataset:
    """The shipped default: 3,000 clips, 6 speakers, inputs (1, 40, 40)."""
    stored = read_embedded(path)
    return fsdd_dataset(
        "fsdd", stored.features, stored.digits, stored.speakers, stored.takes, stored.speaker_names
    )
