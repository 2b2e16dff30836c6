"""Codecs by name, for configurations (``"topk:0.01"``), and by id, for decoders."""

from __future__ import annotations

from mgfl.codecs.base import Codec
from mgfl.codecs.dense import Float16, NoCompression
from mgfl.codecs.errors import CodecError
from mgfl.codecs.int8 import Int8, Int8PerChannel
from mgfl.codecs.ternary import SparseTernary, parse_stc
from mgfl.codecs.topk import TopK, parse_fraction

CODEC_SPECS = {
    "none": "float32 as is (lossless)",
    "fp16": "IEEE half precision, 2 bytes an entry",
    "int8": "8-bit symmetric, one scale per tensor",
    "int8-channel": "8-bit symmetric, one scale per output channel",
    "topk:F": "the fraction F (0.01 or 1%) of largest entries, with error feedback",
    "stc:F[:B]": "sparse ternary: the fraction F of largest entries of the whole update as "
                 "positions and signs, with error feedback; BatchNorm statistics as B-bit "
                 "(default 2) deltas; one compact bundle",
}

_DECODERS: dict[int, Codec] = {
    codec.codec_id: codec
    for codec in (NoCompression(), Float16(), Int8(), Int8PerChannel(), TopK(),
                  SparseTernary())
}


def get_codec(spec: str) -> Codec:
    """The codec a configuration string names (see :data:`CODEC_SPECS`)."""
    name, _, argument = spec.strip().partition(":")
    simple = {"none": NoCompression, "fp16": Float16, "int8": Int8, "int8-channel": Int8PerChannel}
    if name in simple and not argument:
        return simple[name]()
    if name == "topk":
        if not argument:
            raise ValueError("topk needs a fraction: topk:0.01 or topk:1%")
        return TopK(parse_fraction(argument))
    if name == "stc":
        if not argument:
            raise ValueError("stc needs a fraction: stc:0.01, or stc:0.01:3 for 3-bit statistics")
        return SparseTernary(*parse_stc(argument))
    raise ValueError(f"unknown codec {spec!r}; codecs: {', '.join(CODEC_SPECS)}")


def decoders() -> dict[int, Codec]:
    """One decoding instance per codec id (decoding needs no codec parameters)."""
    return dict(_DECODERS)


def decoder_for(codec_id: int) -> Codec:
    if codec_id not in _DECODERS:
        raise CodecError(f"unknown codec id {codec_id}")
    return _DECODERS[codec_id]
