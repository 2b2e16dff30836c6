"""Smartwatch shoulder-exercise recordings that seglearn ships (10 subjects, 6 channels at 50 Hz,
7 exercises), cut into fixed windows for a 1-D CNN with the subject of each window."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mgfl.data.dataset import Dataset
from mgfl.data.package_data import shipped_file

WATCH_FILE = "seglearn/data/watch_dataset.npy"
WATCH_INSTALL_HINT = "pip install 'mgfl[datasets]'  (or: pip install seglearn)"
WATCH_ATTRIBUTION = (
    "Smartwatch shoulder-rehabilitation exercises (Burns, Leung, Hardisty, Whyne, Henry, "
    "McLachlin: 'Shoulder physiotherapy exercise recognition: machine learning the inertial "
    "signals from a smartwatch', arXiv:1802.01489), as shipped in the seglearn package "
    "(BSD 3-Clause)."
)


def watch_file() -> Path:
    return shipped_file(
        "seglearn",
        WATCH_FILE,
        what="the seglearn smartwatch data set",
        install_hint=WATCH_INSTALL_HINT,
    )


def read_recordings(path: Path) -> dict:
    """The recordings as seglearn stores them: a dict with X (list of (T, 6) arrays), y, subject,
    y_labels, X_labels."""
    # The file is a pickled dict. Unpickling runs code from the file, which is acceptable only
    # because it comes from an installed package the user chose to trust (never a download).
    return np.load(path, allow_pickle=True).item()


def sliding_windows(signal: np.ndarray, length: int, step: int) -> np.ndarray:
    """``(count, length, channels)`` windows starting every ``step`` samples; a tail shorter than
    ``length`` is left out."""
    count = 0 if len(signal) < length else 1 + (len(signal) - length) // step
    starts = np.arange(count) * step
    return np.stack([signal[s : s + length] for s in starts]) if count else np.empty(
        (0, length, signal.shape[1]), dtype=signal.dtype
    )


def load_watch(
    *,
    window: int = 128,
    step: int = 64,
    test_subjects: Sequence[int] = (9, 10),
    path: Path | None = None,
) -> Dataset:
    """Windows of ``window`` samples (128 = 2.56 s) every ``step`` samples (50% overlap), shaped
    ``(6, 1, window)``; subjects in ``test_subjects`` form the test set. Each channel is
    standardised with the mean and deviation of the training subjects' samples only."""
    if not 0 < step <= window:
        raise ValueError(f"window step must be in 1..{window}, got {step}")
    stored = read_recordings(path or watch_file())
    subjects = np.asarray(stored["subject"], dtype=np.int64)
    subject_ids = sorted(int(s) for s in np.unique(subjects))
    unknown = sorted(set(test_subjects) - set(subject_ids))
    if unknown:
        raise ValueError(f"test subjects {unknown} are not in the data (subjects {subject_ids})")
    recordings = [np.asarray(x, dtype=np.float64) for x in stored["X"]]
    is_test = np.isin(subjects, np.asarray(test_subjects))
    train_samples = np.concatenate(
        [r for r, t in zip(recordings, is_test, strict=True) if not t]
    )
    mean, std = train_samples.mean(axis=0), train_samples.std(axis=0)

    split: dict[bool, tuple[list, list, list]] = {False: ([], [], []), True: ([], [], [])}
    rows = zip(recordings, stored["y"], subjects, is_test, strict=True)
    for recording, label, subject, test in rows:
        windows = sliding_windows((recording - mean) / std, window, step)
        xs, ys, gs = split[bool(test)]
        xs.append(windows.transpose(0, 2, 1)[:, :, None, :])
        ys.append(np.full(len(windows), int(label)))
        gs.append(np.full(len(windows), subject_ids.index(int(subject))))
    channels = len(stored["X_labels"])
    parts = {
        test: (
            np.concatenate(xs) if xs else np.empty((0, channels, 1, window)),
            np.concatenate(ys) if ys else np.empty(0),
            np.concatenate(gs) if gs else np.empty(0),
        )
        for test, (xs, ys, gs) in split.items()
    }
    return Dataset(
        name="watch",
        x_train=parts[False][0],
        y_train=parts[False][1],
        x_test=parts[True][0],
        y_test=parts[True][1],
        groups_train=parts[False][2],
        groups_test=parts[True][2],
        classes=[str(label) for label in stored["y_labels"]],
        group_names=[f"subject-{s}" for s in subject_ids],
        attribution=WATCH_ATTRIBUTION,
    )
