import numpy as np
import pytest

from mgfl.data.watch import load_watch, read_recordings, sliding_windows, watch_file
from tests.mgfl.data.conftest import optional


def test_sliding_windows_step_and_tail():
    signal = np.arange(20, dtype=float).reshape(10, 2)
    windows = sliding_windows(signal, 4, 2)
    assert windows.shape == (4, 4, 2)  # starts 0, 2, 4, 6; 8 would run past the end
    assert np.array_equal(windows[1], signal[2:6])
    assert sliding_windows(signal[:3], 4, 2).shape == (0, 4, 2)


@pytest.fixture(scope="module")
def watch():
    return optional(load_watch)


def test_windows_shape_and_subject_split(watch):
    assert watch.input_shape == (6, 1, 128)
    assert watch.num_classes == 7
    assert watch.group_names == [f"subject-{s}" for s in range(1, 11)]
    assert set(watch.groups_train) == set(range(8))
    assert set(watch.groups_test) == {8, 9}  # subjects 9 and 10
    assert set(watch.y_test) == set(range(7))


def test_window_count_matches_the_recordings(watch):
    stored = read_recordings(watch_file())
    expected = sum(1 + (len(x) - 128) // 64 for x in stored["X"])
    assert len(watch.y_train) + len(watch.y_test) == expected


def test_windows_hold_standardised_recording_samples(watch):
    stored = read_recordings(watch_file())
    subjects = np.asarray(stored["subject"])
    rows = zip(stored["X"], subjects, strict=True)
    train = np.concatenate([x for x, s in rows if s not in (9, 10)])
    mean, std = train.mean(axis=0), train.std(axis=0)
    first = np.flatnonzero(subjects <= 8)[0]
    expected = (np.asarray(stored["X"][first])[64:192] - mean) / std
    assert np.allclose(watch.x_train[1, :, 0, :], expected.T, atol=1e-5)
    assert watch.y_train[1] == stored["y"][first]
    # standardised on the training subjects only: train is near 0/1, test is not exactly
    flat = watch.x_train.transpose(1, 0, 2, 3).reshape(6, -1)
    assert np.allclose(flat.mean(axis=1), 0, atol=0.05)
    assert np.allclose(flat.std(axis=1), 1, atol=0.05)


def test_options_change_windows_and_test_subjects():
    data = optional(load_watch, window=64, step=64, test_subjects=(1,))
    assert data.input_shape == (6, 1, 64)
    assert set(data.groups_test) == {0}
    with pytest.raises(ValueError, match="not in the data"):
        load_watch(test_subjects=(11,))
