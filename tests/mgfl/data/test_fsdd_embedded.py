import numpy as np

from mgfl.data.audio_features import clip_features
from mgfl.data.build_embedded import ATTRIBUTION_FILE, build_embedded
from mgfl.data.fsdd_embedded import (
    EMBEDDED_DIR,
    EMBEDDED_FILE,
    EMBEDDED_OPTIONS,
    LEVELS,
    dequantise_unit,
    load_fsdd_embedded,
    quantise_unit,
    read_embedded,
)
from mgfl.data.wav import read_wav
from tests.mgfl.data.conftest import needs_spafe

HALF_STEP = 0.5 / LEVELS + 1e-6


def test_embedded_set_shapes_and_counts():
    data = load_fsdd_embedded()
    assert data.name == "fsdd"
    assert data.input_shape == (1, 40, 40)
    assert len(data.y_train) + len(data.y_test) == 3000
    assert len(data.y_train) == 2700 and len(data.y_test) == 300  # takes 5-49 / 0-4
    assert len(data.group_names) == 6
    assert np.bincount(data.groups_train).tolist() == [450] * 6
    assert np.bincount(data.y_test).tolist() == [30] * 10
    assert data.x_train.min() >= 0 and data.x_train.max() <= 1
    assert "CC BY-SA 4.0" in data.attribution


def test_embedded_file_is_small_and_attributed():
    assert EMBEDDED_FILE.stat().st_size < 4 * 2**20
    text = (EMBEDDED_DIR / ATTRIBUTION_FILE).read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in text and "Zohar Jackson" in text


def test_embedded_takes_follow_the_official_split():
    stored = read_embedded()
    assert stored.options == EMBEDDED_OPTIONS
    assert sorted(set(stored.takes.tolist())) == list(range(50))
    rows = zip(stored.names[:60], stored.takes[:60], stored.digits[:60], strict=True)
    for name, take, digit in rows:
        assert name.startswith(f"{digit}_") and name.endswith(f"_{take}.wav")


def test_quantisation_round_trip_is_within_half_a_step(rng):
    values = rng.uniform(0, 1, size=1000)
    assert np.abs(dequantise_unit(quantise_unit(values)) - values).max() <= HALF_STEP


def test_embedded_features_equal_features_from_the_wavs(fsdd_recordings):
    needs_spafe()
    stored = read_embedded()
    features = stored.features
    for index in (0, 777, 1501, 2999):
        signal, rate = read_wav(fsdd_recordings / stored.names[index])
        fresh = clip_features(signal, rate, stored.options)
        assert np.abs(features[index] - fresh).max() <= HALF_STEP, stored.names[index]


def test_build_embedded_regenerates_the_same_codes(fsdd_slice, tmp_path):
    needs_spafe()
    target = build_embedded(fsdd_slice, tmp_path / "out", cache_dir=tmp_path / "cache")
    rebuilt = read_embedded(target)
    shipped = read_embedded()
    for i, name in enumerate(rebuilt.names):
        j = shipped.names.index(name)
        # the same codes; a last-bit difference in the FFT may move a value across a rounding edge
        difference = np.abs(rebuilt.codes[i].astype(int) - shipped.codes[j].astype(int))
        assert difference.max() <= 1 and np.count_nonzero(difference) <= 2, name
        assert rebuilt.digits[i] == shipped.digits[j] and rebuilt.takes[i] == shipped.takes[j]
    assert (tmp_path / "out" / ATTRIBUTION_FILE).is_file()
    data = load_fsdd_embedded(target)
    assert data.group_names == ["jackson", "theo"]
