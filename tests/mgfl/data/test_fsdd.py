from pathlib import Path

import numpy as np
import pytest

import mgfl.data.fsdd as fsdd
from mgfl.data.audio_features import AudioFeatureOptions
from mgfl.data.fsdd import find_clips, load_fsdd_recordings, parse_clip
from tests.mgfl.data.conftest import SLICE_DIGITS, SLICE_SPEAKERS, SLICE_TAKES, needs_spafe


def test_parse_clip_reads_digit_speaker_and_take():
    clip = parse_clip(Path("7_yweweler_42.wav"))
    assert (clip.digit, clip.speaker, clip.take, clip.is_test) == (7, "yweweler", 42, False)
    assert parse_clip(Path("3_theo_4.wav")).is_test
    assert parse_clip(Path("notes.wav")) is None
    assert parse_clip(Path("12_theo_4.wav")) is None


def test_find_clips_orders_and_finds_the_recordings_folder(fsdd_slice):
    clips = find_clips(fsdd_slice.parent)  # the folder above, as FSDD is laid out
    assert len(clips) == len(SLICE_SPEAKERS) * len(SLICE_DIGITS) * len(SLICE_TAKES)
    keys = [(c.speaker, c.digit, c.take) for c in clips]
    assert keys == sorted(keys)


def test_find_clips_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no FSDD recordings directory"):
        find_clips(tmp_path / "absent")
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        find_clips(tmp_path)


def test_loader_splits_by_take_and_keeps_speakers(fsdd_slice, tmp_path):
    needs_spafe()
    data = load_fsdd_recordings(fsdd_slice, cache_dir=tmp_path / "cache")
    per_test_takes = sum(t < 5 for t in SLICE_TAKES)
    per_train_takes = len(SLICE_TAKES) - per_test_takes
    cells = len(SLICE_SPEAKERS) * len(SLICE_DIGITS)
    assert len(data.y_test) == cells * per_test_takes
    assert len(data.y_train) == cells * per_train_takes
    assert data.input_shape == (1, 40, 40)
    assert data.group_names == sorted(SLICE_SPEAKERS)
    assert set(data.y_train) == set(SLICE_DIGITS) == set(data.y_test)
    assert np.bincount(data.groups_train).tolist() == [len(SLICE_DIGITS) * per_train_takes] * 2
    assert data.classes == [str(d) for d in range(10)]
    assert "CC BY-SA 4.0" in data.attribution


def test_features_are_cached_by_parameters(fsdd_slice, tmp_path, monkeypatch):
    needs_spafe()
    computed = []
    real = fsdd.clip_features

    def counting(signal, rate, options):
        computed.append(options)
        return real(signal, rate, options)

    monkeypatch.setattr(fsdd, "clip_features", counting)
    cache = tmp_path / "cache"
    count = len(find_clips(fsdd_slice))

    first = load_fsdd_recordings(fsdd_slice, cache_dir=cache)
    assert len(computed) == count
    second = load_fsdd_recordings(fsdd_slice, cache_dir=cache)
    assert len(computed) == count  # a hit: nothing recomputed
    assert np.array_equal(first.x_train, second.x_train)
    assert len(list((cache / "features").glob("*.npz"))) == 1

    shorter = AudioFeatureOptions(frames=32)
    other = load_fsdd_recordings(fsdd_slice, cache_dir=cache, options=shorter)
    assert len(computed) == 2 * count  # another parameter: recomputed, stored beside the first
    assert other.input_shape == (1, 32, 40)
    assert len(list((cache / "features").glob("*.npz"))) == 2


def test_a_changed_file_list_misses_the_cache(fsdd_slice, tmp_path):
    needs_spafe()
    cache = tmp_path / "cache"
    clips = find_clips(fsdd_slice)
    options = AudioFeatureOptions()
    _, path, hit = fsdd.clip_feature_matrix(clips, options, cache_dir=cache)
    assert not hit
    _, same_path, hit = fsdd.clip_feature_matrix(clips, options, cache_dir=cache)
    assert hit and same_path == path
    _, other_path, hit = fsdd.clip_feature_matrix(clips[:-1], options, cache_dir=cache)
    assert not hit and other_path != path


def test_progress_reports_every_clip(fsdd_slice, tmp_path):
    needs_spafe()
    seen = []
    load_fsdd_recordings(
        fsdd_slice, cache_dir=tmp_path, progress=lambda done, total: seen.append((done, total))
    )
    total = len(find_clips(fsdd_slice))
    assert seen == [(i, total) for i in range(1, total + 1)]
