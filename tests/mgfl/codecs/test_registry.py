"""Codecs by configuration string and by wire id."""

from __future__ import annotations

import pytest

from mgfl.codecs import CodecError, decoder_for, get_codec


@pytest.mark.parametrize(
    ("spec", "name", "fraction"),
    [("none", "none", None), ("fp16", "fp16", None), ("int8", "int8", None),
     ("int8-channel", "int8-channel", None), ("topk:0.01", "topk", 0.01),
     ("topk:0.1%", "topk", 0.001), (" topk:1 ", "topk", 1.0), ("stc:0.01", "stc", 0.01),
     ("stc:2%:3", "stc", 0.02)],
)
def test_specs(spec, name, fraction):
    codec = get_codec(spec)
    assert codec.name == name
    assert getattr(codec, "fraction", None) == (pytest.approx(fraction) if fraction else None)
    assert get_codec(codec.spec).spec == codec.spec


@pytest.mark.parametrize("spec", ["gzip", "topk", "topk:0", "topk:2", "topk:abc", "int8:3",
                                  "stc", "stc:0", "stc:0.01:9"])
def test_bad_specs_say_what_exists(spec):
    with pytest.raises(ValueError, match="top-?k|codec|stc"):
        get_codec(spec)


def test_ids_are_unique_and_decoders_exist():
    ids = {get_codec(s).codec_id
           for s in ("none", "fp16", "int8", "int8-channel", "topk:0.1", "stc:0.1")}
    assert len(ids) == 6
    for codec_id in ids:
        assert decoder_for(codec_id).codec_id == codec_id
    with pytest.raises(CodecError):
        decoder_for(200)


def test_only_topk_and_stc_want_error_feedback_and_are_sparse():
    assert get_codec("topk:0.1").error_feedback and get_codec("stc:0.1").error_feedback
    assert get_codec("stc:0.1").sparse and get_codec("stc:0.1").whole_update
    assert not get_codec("topk:0.1").whole_update
    assert not any(get_codec(s).error_feedback for s in ("none", "fp16", "int8", "int8-channel"))
    assert get_codec("none").lossless
    assert get_codec("topk:0.1").sparse
    assert not any(get_codec(s).sparse for s in ("none", "fp16", "int8", "int8-channel"))
