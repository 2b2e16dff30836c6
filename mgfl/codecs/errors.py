"""The one error every decoder raises, so that a server can reject a bad update without a crash."""

from __future__ import annotations


class CodecError(ValueError):
    """Bytes that are not a valid encoding: truncated, inconsistent, of an unknown version or codec,
    or describing an array that does not fit what the receiver expects. The message says which."""
