import wave

import numpy as np
import pytest

from mgfl.data.audio_features import AudioFeatureOptions, clip_features, fix_frames
from mgfl.data.wav import read_wav
from tests.mgfl.data.conftest import needs_spafe


def test_options_reject_unknown_and_inconsistent_values():
    with pytest.raises(ValueError, match="unknown audio feature option"):
        AudioFeatureOptions.from_options(melz=40)
    with pytest.raises(ValueError, match="feature kind"):
        AudioFeatureOptions(kind="spectrum")
    with pytest.raises(ValueError, match="ceps"):
        AudioFeatureOptions(kind="mfcc", ceps=50, mels=40)
    with pytest.raises(ValueError, match="nfft"):
        AudioFeatureOptions(window_ms=100, nfft=512)
    assert AudioFeatureOptions.from_options(frames=32).shape == (1, 32, 40)
    assert AudioFeatureOptions(kind="mfcc", ceps=13).shape == (1, 40, 13)


def test_fix_frames_pads_short_clips_with_zeros():
    values = np.ones((3, 2))
    fixed = fix_frames(values, values.sum(axis=1), 5)
    assert fixed.shape == (5, 2)
    assert np.array_equal(fixed[:3], values) and not fixed[3:].any()


def test_fix_frames_keeps_the_loudest_window():
    values = np.arange(10, dtype=float)[:, None] * np.ones((1, 2))
    energy = np.array([0, 0, 5, 9, 9, 1, 0, 0, 0, 0], dtype=float)
    fixed = fix_frames(values, energy, 3)
    assert np.array_equal(fixed[:, 0], [2, 3, 4])


def test_read_wav_scales_16_bit_pcm(tmp_path):
    samples = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    path = tmp_path / "x.wav"
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(8000)
        f.writeframes(samples.tobytes())
    signal, rate = read_wav(path)
    assert rate == 8000
    assert np.allclose(signal, [0, 0.5, -1, 32767 / 32768])


def test_log_mel_of_a_real_clip(fsdd_recordings):
    needs_spafe()
    signal, rate = read_wav(fsdd_recordings / "5_nicolas_7.wav")
    options = AudioFeatureOptions()
    features = clip_features(signal, rate, options)
    assert features.shape == (options.frames, options.mels) and features.dtype == np.float32
    assert features.min() >= 0 and features.max() == pytest.approx(1.0)
    # a short clip: the frames past its end are padding (silence = 0)
    clip_frames = 1 + (len(signal) - options.window_samples) // options.hop_samples
    assert clip_frames < options.frames
    assert not features[clip_frames:].any() and features[:clip_frames].any()


def test_log_mel_ignores_loudness_and_differs_between_clips(fsdd_recordings):
    needs_spafe()
    a, rate = read_wav(fsdd_recordings / "0_george_10.wav")
    b, _ = read_wav(fsdd_recordings / "9_george_10.wav")
    options = AudioFeatureOptions()
    fa = clip_features(a, rate, options)
    assert np.allclose(fa, clip_features(0.25 * a, rate, options), atol=1e-5)
    assert np.abs(fa - clip_features(b, rate, options)).mean() > 0.05


def test_mfcc_shape_and_normalisation(fsdd_recordings):
    needs_spafe()
    signal, rate = read_wav(fsdd_recordings / "2_lucas_20.wav")
    options = AudioFeatureOptions(kind="mfcc", ceps=13, frames=200)
    features = clip_features(signal, rate, options)
    frames = 1 + (len(signal) - options.window_samples) // options.hop_samples
    assert features.shape == (200, 13)
    assert np.allclose(features[:frames].mean(axis=0), 0, atol=1e-4)
    assert features[:frames].std() > 0.1
    assert not features[frames:].any()


def test_wrong_sample_rate_is_an_error(fsdd_recordings):
    needs_spafe()
    signal, rate = read_wav(fsdd_recordings / "2_lucas_20.wav")
    with pytest.raises(ValueError, match="8000 Hz"):
        clip_features(signal, rate, AudioFeatureOptions(sample_rate=16000, nfft=1024))
