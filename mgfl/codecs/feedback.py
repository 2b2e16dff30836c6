"""Error feedback: what a lossy codec did not send is kept and added to the next update.

The caller owns the residual (a client keeps it in its persistent Flower state), so that the codec
itself stays stateless. The accounting is exact: ``sent + new_residual == update + old_residual``
entry by entry, so over any number of rounds everything the client computed either arrived or is
still waiting in the residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mgfl.codecs.base import Codec


@dataclass(frozen=True)
class FeedbackStep:
    """One array after error-feedback encoding."""

    payload: bytes | None  # None: nothing travels this round
    sent: np.ndarray  # what the receiver decodes (zeros when nothing travels)
    residual: np.ndarray  # what stays behind for the next round


def encode_with_feedback(
    codec: Codec,
    update: np.ndarray,
    residual: np.ndarray | None,
    rng: np.random.Generator | None = None,
) -> FeedbackStep:
    """Encodes ``update + residual`` and returns the residual left after what was sent."""
    update = np.asarray(update)
    corrected = update if residual is None else update + np.asarray(residual, update.dtype)
    payload = codec.encode(corrected, rng)
    if payload is None:
        sent = np.zeros_like(corrected)
    else:
        sent = codec.decode(payload, corrected.shape, corrected.dtype)
    return FeedbackStep(payload, sent, corrected - sent)
