"""Update codecs shared by client and server: how model arrays become the bytes a round costs.

``get_codec("topk:0.01")`` builds a codec; ``encode_update`` / ``decode_update`` turn a dict of
arrays into one self-describing bundle and back. Every decoder raises :class:`CodecError` on
malformed input.
"""

from mgfl.codecs.base import Codec, TensorRecord, encode_record, read_record
from mgfl.codecs.errors import CodecError
from mgfl.codecs.feedback import FeedbackStep, encode_with_feedback
from mgfl.codecs.registry import CODEC_SPECS, decoder_for, get_codec
from mgfl.codecs.update import EncodedUpdate, decode_update, encode_update

__all__ = [
    "CODEC_SPECS", "Codec", "CodecError", "EncodedUpdate", "FeedbackStep", "TensorRecord",
    "decode_update", "decoder_for", "encode_record", "encode_update", "encode_with_feedback",
    "get_codec", "read_record",
]
