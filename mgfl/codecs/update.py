"""A model update as one byte string: a bundle of tensor records, the unit a Flower message
carries in each direction and whose length is the bytes a round costs.

Bundle layout: ``b"MGU" | u8 version | varint record count | records`` (see ``base`` for a
record). Arrays a sparse codec sends nothing for are left out of the bundle; the receiver takes
a missing array as an all-zero update. A codec that encodes whole updates (``stc``) writes a
compact bundle instead (``b"MGC"``, see ``compact``), which the decoder recognises by its magic.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from mgfl.codecs.base import DEFAULT_MAX_ELEMENTS, VERSION, Codec, encode_record, read_record
from mgfl.codecs.compact import COMPACT_MAGIC, decode_compact, encode_compact
from mgfl.codecs.errors import CodecError
from mgfl.codecs.feedback import encode_with_feedback
from mgfl.codecs.registry import decoders
from mgfl.codecs.wire import ByteReader, varint

BUNDLE_MAGIC = b"MGU"


@dataclass
class EncodedUpdate:
    """An encoded bundle and what the sender needs to keep."""

    blob: bytes
    sent: dict[str, np.ndarray]  # what the receiver will decode, per array (zeros if left out)
    residuals: dict[str, np.ndarray] = field(default_factory=dict)  # error feedback, if used
    records: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.blob)


def encode_update(
    arrays: Mapping[str, np.ndarray],
    codec: Codec,
    residuals: Mapping[str, np.ndarray] | None = None,
    rng: np.random.Generator | None = None,
    codec_of: Mapping[str, Codec] | None = None,
    reference: Mapping[str, np.ndarray] | None = None,
    omit: Collection[str] = (),
) -> EncodedUpdate:
    """Encodes every array with ``codec``, or with ``codec_of[name]`` where given; arrays whose
    codec wants error feedback have their ``residuals`` (from the previous call, or None at
    first) added in, and the new ones are returned.

    A whole-update codec (``stc``) encodes everything in one compact bundle: the arrays named in
    ``codec_of`` (which must name that same codec) are the running statistics, coded against
    their global values in ``reference`` (what the sender received).

    Arrays named in ``omit`` do not travel this time (the receiver keeps its values, as for an
    all-zero change) and keep the residual they had."""
    omit = frozenset(omit)
    unknown = sorted(omit - set(arrays))
    if unknown:
        raise CodecError(f"cannot leave out arrays the update does not hold: {unknown[:3]}")
    carried = {name: residuals[name] for name in omit if residuals and name in residuals}
    if codec.whole_update:
        encoded = _encode_whole(arrays, codec, residuals, rng, codec_of or {}, reference, omit)
        encoded.residuals.update(carried)
        return encoded
    records: list[bytes] = []
    sent: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = dict(carried)
    for name, array in arrays.items():
        array = np.asarray(array)
        if name in omit:
            sent[name] = np.zeros_like(array)
            continue
        chosen = codec_of.get(name, codec) if codec_of else codec
        if chosen.error_feedback:
            previous = None if residuals is None else residuals.get(name)
            if previous is not None and np.shape(previous) != array.shape:
                raise CodecError(f"{name}: residual of shape {np.shape(previous)} for an array "
                                 f"of shape {array.shape}")
            step = encode_with_feedback(chosen, array, previous, rng)
            payload, sent[name], kept[name] = step.payload, step.sent, step.residual
        else:
            payload = chosen.encode(array, rng)
            sent[name] = (np.zeros_like(array) if payload is None
                          else chosen.decode(payload, array.shape, array.dtype))
        if payload is not None:
            records.append(encode_record(name, array, chosen.codec_id, payload))
    blob = b"".join([BUNDLE_MAGIC, bytes([VERSION]), varint(len(records)), *records])
    return EncodedUpdate(blob, sent, kept, len(records))


def _encode_whole(arrays, codec, residuals, rng, codec_of, reference, omit) -> EncodedUpdate:
    others = sorted({c.spec for c in codec_of.values()} - {codec.spec})
    if others:
        raise CodecError(f"{codec.spec} encodes the whole update, statistics included; it cannot "
                         f"leave some arrays to {', '.join(others)}")
    blob, sent, steps = encode_compact(arrays, codec, residuals, rng, set(codec_of), reference,
                                       omit)
    residual = {name: step.residual for name, step in steps.items()}
    return EncodedUpdate(blob, sent, residual, sum(1 for a in sent.values() if np.any(a)))


def decode_update(
    blob: bytes,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    reference: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of a bundle. With ``expected`` (name -> shape), every record must name one of
    those arrays with exactly that shape; arrays not present were not sent. A compact bundle
    needs ``expected`` (its arrays are named by their place in it), and ``reference`` (the
    global values) where its statistics travel as log ratios."""
    if bytes(blob[:len(COMPACT_MAGIC)]) == COMPACT_MAGIC:
        return decode_compact(bytes(blob), expected, reference)
    reader = ByteReader(blob, "update bundle")
    if reader.take(len(BUNDLE_MAGIC)) != BUNDLE_MAGIC:
        raise reader.fail("not an mgfl update bundle (bad magic)")
    version = reader.u8()
    if version != VERSION:
        raise reader.fail(f"bundle format version {version}; this mgfl reads version {VERSION}")
    count = reader.varint()
    if expected is not None and count > len(expected):
        raise reader.fail(f"{count} records, but only {len(expected)} arrays may travel")
    table = decoders()
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        record = read_record(reader, table, max_elements, expected)
        if record.name in out:
            raise reader.fail(f"array {record.name!r} appears twice")
        if expected is not None:
            if record.name not in expected:
                raise reader.fail(f"unexpected array {record.name!r}")
            if tuple(record.array.shape) != tuple(expected[record.name]):
                raise reader.fail(f"{record.name} has shape {record.array.shape}, expected "
                                  f"{tuple(expected[record.name])}")
        out[record.name] = record.array
    reader.expect_end()
    return out
