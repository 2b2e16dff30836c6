"""Bounded byte reading and writing: unsigned LEB128 varints, single bytes and raw runs.

Every read checks the remaining length first, so malformed input raises :class:`CodecError` and
never an ``IndexError`` or a huge allocation. Varints must be minimal (no redundant trailing zero
groups), so each value has exactly one encoding and re-encoding a decoded input gives its bytes.
"""

from __future__ import annotations

from mgfl.codecs.errors import CodecError

MAX_VARINT_BYTES = 9  # 63 bits: more than any count or length a model can have


def varint(value: int) -> bytes:
    """The unsigned LEB128 encoding of ``value`` (0 <= value < 2**63)."""
    if value < 0 or value >= 1 << 63:
        raise CodecError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint_size(value: int) -> int:
    """Bytes :func:`varint` takes for ``value``."""
    return max(1, -(-value.bit_length() // 7))


class ByteReader:
    """Reads a byte string front to back; ``what`` names the structure in error messages."""

    def __init__(self, data: bytes | bytearray | memoryview, what: str):
        self._data = memoryview(bytes(data))
        self._pos = 0
        self.what = what

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def fail(self, problem: str) -> CodecError:
        return CodecError(f"{self.what}: {problem} (at byte {self._pos})")

    def take(self, count: int) -> bytes:
        if count < 0 or count > self.remaining:
            raise self.fail(f"needs {count} more bytes, {self.remaining} left")
        start = self._pos
        self._pos += count
        return bytes(self._data[start:self._pos])

    def u8(self) -> int:
        return self.take(1)[0]

    def varint(self) -> int:
        value = 0
        for i in range(MAX_VARINT_BYTES):
            byte = self.u8()
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if byte == 0 and i > 0:
                    raise self.fail("varint is not minimally encoded")
                return value
        raise self.fail(f"varint longer than {MAX_VARINT_BYTES} bytes")

    def expect_end(self) -> None:
        if self.remaining:
            raise self.fail(f"{self.remaining} unexpected trailing bytes")
