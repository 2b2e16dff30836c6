"""Log-mel and MFCC features of one clip, fixed to a frame count so that a CNN sees one shape.

The spectral work (pre-emphasis, framing, windowing, FFT, mel filter bank, DCT) is done by spafe, a
pure-Python library on NumPy and SciPy that installs on a phone (see docs/data.md); this module only
chooses its parameters, scales the result and pads or crops it. spafe is imported when features are
computed, so loading stored features needs no audio package."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from mgfl.data.errors import DatasetNotInstalledError

FEATURE_KINDS = ("logmel", "mfcc")
AUDIO_INSTALL_HINT = "pip install 'mgfl[audio]'  (or: pip install spafe)"
SPAFE = "the audio feature library spafe"


@dataclass(frozen=True)
class AudioFeatureOptions:
    """Every parameter that changes the features; the feature cache is keyed by all of them.

    ``logmel``: mel power in dB below the clip's loudest value, floored at ``-top_db`` and mapped
    to [0, 1] (0 = silence, which is also the padding). ``mfcc``: spafe's MFCCs with its per-clip
    "mvn" normalisation (each coefficient's mean removed, all divided by one deviation), so that
    the zero padding equals the clip's mean."""

    kind: str = "logmel"
    sample_rate: int = 8000
    frames: int = 40
    mels: int = 40
    ceps: int = 13
    window_ms: float = 40.0
    hop_ms: float = 20.0
    nfft: int = 512
    top_db: float = 80.0
    pre_emphasis: float = 0.97

    def __post_init__(self) -> None:
        if self.kind not in FEATURE_KINDS:
            choices = ", ".join(FEATURE_KINDS)
            raise ValueError(f"feature kind {self.kind!r}: choose one of {choices}")
        if min(self.frames, self.mels, self.ceps, self.nfft, self.sample_rate) < 1:
            raise ValueError("frames, mels, ceps, nfft and sample_rate must be positive")
        if self.kind == "mfcc" and self.ceps > self.mels:
            raise ValueError(f"ceps ({self.ceps}) cannot exceed mels ({self.mels})")
        if not 0 < self.hop_ms <= self.window_ms:
            raise ValueError("hop_ms must be positive and at most window_ms")
        if self.window_samples > self.nfft:
            raise ValueError(f"a {self.window_samples}-sample window does not fit nfft={self.nfft}")
        if self.top_db <= 0:
            raise ValueError("top_db must be positive")

    @classmethod
    def from_options(cls, **options: object) -> AudioFeatureOptions:
        """Builds options from keyword arguments, naming any that do not exist."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown audio feature option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**options)  # type: ignore[arg-type]

    @property
    def window_samples(self) -> int:
        return round(self.window_ms * self.sample_rate / 1000)

    @property
    def hop_samples(self) -> int:
        return round(self.hop_ms * self.sample_rate / 1000)

    @property
    def coefficients(self) -> int:
        return self.mels if self.kind == "logmel" else self.ceps

    @property
    def shape(self) -> tuple[int, int, int]:
        """The model input shape: one channel of frames x coefficients."""
        return (1, self.frames, self.coefficients)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def spafe_version() -> str:
    """The installed spafe's version: part of the cache key, as a release may change values."""
    import importlib.metadata

    try:
        return importlib.metadata.version("spafe")
    except importlib.metadata.PackageNotFoundError as err:
        raise DatasetNotInstalledError(SPAFE, AUDIO_INSTALL_HINT) from err


def clip_features(signal: np.ndarray, rate: int, options: AudioFeatureOptions) -> np.ndarray:
    """Features of one mono clip as float32 ``(options.frames, options.coefficients)``."""
    if rate != options.sample_rate:
        raise ValueError(
            f"a clip sampled at {rate} Hz, but the features are set for {options.sample_rate} Hz "
            f"(pass sample_rate={rate} or resample the recordings)"
        )
    signal = np.asarray(signal, dtype=np.float64)
    if len(signal) < options.window_samples:
        signal = np.pad(signal, (0, options.window_samples - len(signal)))
    spafe = _spafe()
    # spafe takes seconds and truncates seconds * rate to samples; half a sample more makes the
    # truncation land on the intended integer count whatever the float rounding.
    window = spafe.SlidingWindow(
        (options.window_samples + 0.5) / rate, (options.hop_samples + 0.5) / rate, "hamming"
    )
    common = dict(
        fs=rate,
        pre_emph=options.pre_emphasis > 0,
        pre_emph_coeff=options.pre_emphasis,
        window=window,
        nfilts=options.mels,
        nfft=options.nfft,
        low_freq=0,
        high_freq=rate / 2,
    )
    power, _ = spafe.mel_spectrogram(signal, **common)
    loudness = _unit_log_mel(power, options.top_db)
    if options.kind == "logmel":
        values = loudness
    else:
        values = spafe.mfcc(signal, num_ceps=options.ceps, normalize="mvn", **common)
    return fix_frames(values, loudness.sum(axis=1), options.frames).astype(np.float32)


def fix_frames(values: np.ndarray, energy: np.ndarray, frames: int) -> np.ndarray:
    """Pads with zeros at the end, or keeps the ``frames`` consecutive frames of most energy
    (the spoken word, not the silence around it); the earliest such window on a tie."""
    count = len(values)
    if count <= frames:
        return np.pad(values, ((0, frames - count), (0, 0)))
    sums = np.convolve(energy, np.ones(frames), mode="valid")
    start = int(np.argmax(sums))
    return values[start : start + frames]


def _unit_log_mel(power: np.ndarray, top_db: float) -> np.ndarray:
    if not np.any(power > 0):
        return np.zeros_like(power)
    decibels = 10.0 * np.log10(np.maximum(power, np.finfo(np.float64).tiny))
    below_peak = decibels - decibels.max()
    return np.clip(below_peak / top_db + 1.0, 0.0, 1.0)


class _Spafe:
    def __init__(self) -> None:
        from spafe.features.mfcc import mel_spectrogram, mfcc
        from spafe.utils.preprocessing import SlidingWindow

        self.mel_spectrogram = mel_spectrogram
        self.mfcc = mfcc
        self.SlidingWindow = SlidingWindow


def _spafe() -> _Spafe:
    try:
        return _Spafe()
    except ImportError as err:
        raise DatasetNotInstalledError(SPAFE, AUDIO_INSTALL_HINT) from err
