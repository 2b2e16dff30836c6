"""How an encoded update rides in a Flower message, in both directions.

The bundle (``mgfl.codecs.update``) travels as the raw bytes of one ``Array`` (dtype uint8, a
stype of its own) in the message's ArrayRecord, so that what Flower carries is exactly the bytes
the codec produced: the length of that Array's data is the byte count a round reports.
"""

from __future__ import annotations

from flwr.app import Array, ArrayRecord, RecordDict

from mgfl.codecs import CodecError

ARRAYS_KEY = "arrays"  # the key Flower's strategies use for the ArrayRecord
CONFIG_KEY = "config"
METRICS_KEY = "metrics"
UPDATE_ARRAY = "update"
BUNDLE_STYPE = "mgfl.update-bundle"


def bundle_record(blob: bytes) -> ArrayRecord:
    """An ArrayRecord carrying one encoded bundle."""
    return ArrayRecord({UPDATE_ARRAY: Array(dtype="uint8", shape=(len(blob),),
                                            stype=BUNDLE_STYPE, data=bytes(blob))})


def bundle_of(content: RecordDict, key: str = ARRAYS_KEY) -> bytes:
    """The bundle bytes of a message's content; CodecError if it carries none."""
    if key not in content.array_records:
        raise CodecError(f"the message carries no ArrayRecord {key!r}")
    record = content.array_records[key]
    if UPDATE_ARRAY not in record:
        raise CodecError(f"ArrayRecord {key!r} has no {UPDATE_ARRAY!r} array")
    array = record[UPDATE_ARRAY]
    if array.stype != BUNDLE_STYPE:
        raise CodecError(f"array {UPDATE_ARRAY!r} is a {array.stype!r}, not an mgfl bundle")
    return bytes(array.data)
