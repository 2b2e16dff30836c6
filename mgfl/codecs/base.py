"""What a codec is, and the self-describing record one encoded tensor travels in.

A record is ``MAGIC VERSION codec_id name dtype shape payload``: the receiver needs nothing but
the bytes (and the registry of codecs) to know what arrived, and checks every field before it
allocates anything. Layout, little-endian, ``varint`` = unsigned LEB128::

    b"MG" | u8 version | u8 codec id | varint len + UTF-8 name | u8 dtype code
          | u8 ndim | ndim x varint dim | varint payload length | payload

Codecs own only the payload; they encode a floating-point array and decode it back to the
record's shape and dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import ClassVar

import numpy as np

from mgfl.codecs.errors import CodecError
from mgfl.codecs.wire import ByteReader, varint

MAGIC = b"MG"
VERSION = 1
MAX_NAME_BYTES = 255
MAX_NDIM = 8
DEFAULT_MAX_ELEMENTS = 1 << 26  # 256 MiB of float32: far above any phone model's largest array

DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float16),
    3: np.dtype(np.float64),
}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}


class Codec(ABC):
    """Turns one floating-point array into payload bytes and back.

    ``lossless`` codecs return exactly what they were given. Biased lossy codecs set
    ``error_feedback``: their callers keep the part that was not sent (the residual) and add it to
    the next update, which makes the compression error vanish over rounds (Karimireddy et al. 2019).
    """

    name: ClassVar[str]
    codec_id: ClassVar[int]
    lossless: ClassVar[bool] = False
    error_feedback: ClassVar[bool] = False
    sparse: ClassVar[bool] = False  # sends only some entries of an array
    whole_update: ClassVar[bool] = False  # encodes a whole update at once (a compact bundle)

    @abstractmethod
    def encode(self, array: np.ndarray, rng: np.random.Generator | None = None) -> bytes | None:
        """The payload of ``array``, or None when this codec sends nothing for it (a sparse codec
        whose budget for this array is zero entries); the receiver then takes it as all zeros."""

    @abstractmethod
    def decode(self, payload: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The array a payload stands for; :class:`CodecError` if the payload cannot be one."""

    @property
    def spec(self) -> str:
        """The registry string that builds this codec again (``"topk:0.01"``)."""
        return self.name

    def __repr__(self) -> str:
        return f"Codec({self.spec})"


def dtype_code(dtype: np.dtype) -> int:
    code = _CODE_OF.get(np.dtype(dtype))
    if code is None:
        raise CodecError(
            f"cannot encode arrays of dtype {np.dtype(dtype)}; codecs take "
            + ", ".join(str(d) for d in DTYPE_CODES.values())
        )
    return code


def require_finite(array: np.ndarray, codec: str) -> None:
    """Lossy encoders refuse NaN and infinity: a diverged update must fail loudly on the client."""
    if not np.all(np.isfinite(array)):
        raise CodecError(f"{codec}: the array holds NaN or infinite values and cannot be encoded")


@dataclass(frozen=True)
class TensorRecord:
    """One decoded record."""

    name: str
    codec_id: int
    array: np.ndarray


def encode_record(name: str, array: np.ndarray, codec_id: int, payload: bytes) -> bytes:
    """Wraps a codec's payload in the self-describing record."""
    name_bytes = name.encode("utf-8")
    if not name_bytes or len(name_bytes) > MAX_NAME_BYTES:
        raise CodecError(f"tensor name must take 1..{MAX_NAME_BYTES} UTF-8 bytes, got {name!r}")
    if array.ndim > MAX_NDIM:
        raise CodecError(f"{name}: {array.ndim} dimensions, at most {MAX_NDIM} are supported")
    parts = [
        MAGIC, bytes([VERSION, codec_id]), varint(len(name_bytes)), name_bytes,
        bytes([dtype_code(array.dtype), array.ndim]),
        *(varint(int(d)) for d in array.shape),
        varint(len(payload)), payload,
    ]  # fmt: skip
    return b"".join(parts)


def read_record(
    reader: ByteReader,
    decoders: dict[int, Codec],
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    expected: Mapping[str, tuple[int, ...]] | None = None,
) -> TensorRecord:
    """Reads one record from ``reader``: header checks, then the codec's payload decoding. With
    ``expected`` (name -> shape), the name and shape are checked before the payload is decoded,
    so a record cannot make the receiver allocate for an array it does not hold."""
    if reader.take(len(MAGIC)) != MAGIC:
        raise reader.fail("not an mgfl tensor record (bad magic)")
    version = reader.u8()
    if version != VERSION:
        raise reader.fail(f"record format version {version}; this mgfl reads version {VERSION}")
    codec_id = reader.u8()
    if codec_id not in decoders:
        raise reader.fail(f"unknown codec id {codec_id}")
    name_length = reader.varint()
    if not 1 <= name_length <= MAX_NAME_BYTES:
        raise reader.fail(f"tensor name length {name_length} outside 1..{MAX_NAME_BYTES}")
    try:
        name = reader.take(name_length).decode("utf-8")
    except UnicodeDecodeError as err:
        raise reader.fail("tensor name is not UTF-8") from err
    code = reader.u8()
    if code not in DTYPE_CODES:
        raise reader.fail(f"{name}: unknown dtype code {code}")
    ndim = reader.u8()
    if ndim > MAX_NDIM:
        raise reader.fail(f"{name}: {ndim} dimensions, at most {MAX_NDIM}")
    shape = tuple(reader.varint() for _ in range(ndim))
    if prod(shape) > max_elements:
        raise reader.fail(f"{name}: shape {shape} exceeds {max_elements} elements")
    if expected is not None:
        if name not in expected:
            raise reader.fail(f"unexpected array {name!r}")
        if shape != tuple(expected[name]):
            raise reader.fail(f"{name} has shape {shape}, expected {tuple(expected[name])}")
    payload = reader.take(reader.varint())
    array = decoders[codec_id].decode(payload, shape, DTYPE_CODES[code])
    return TensorRecord(name, codec_id, array)


def payload_reader(payload: bytes, codec: str) -> ByteReader:
    return ByteReader(payload, f"{codec} payload")


def check_payload_size(payload: bytes, expected: int, codec: str, shape: tuple[int, ...]) -> None:
    if len(payload) != expected:
        raise CodecError(
            f"{codec} payload of shape {shape} must take {expected} bytes, got {len(payload)}"
        )
