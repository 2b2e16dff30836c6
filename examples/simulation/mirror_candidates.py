"""Weight codings tried against stc in ``torch_mirror.py`` and dropped (worse at the same bytes),
kept so that the comparison can be run again. Their bytes are counted from what they would
send (payload bits plus one bfloat16 scale per array and a 16-byte header), not from a wire
format; their BatchNorm statistics arrive exact and uncounted, so compare them with
``torch_mirror.py codec=stc:0.023 statistics=exact`` (measured 2026-11-30 on the H200, seed 0:
stc 2.3% 89.3% after 20 rounds; random-mask fraction=0.18, a seeded 18% of the entries on each
client as one sign bit each, 83.3% at 593 bytes; the same entries on every client (shared=1)
80.3%; low-rank rank=2 46.3% at 638 bytes; rows in benchmarks/h200-2026-11-30-mirror/).

- ``random-mask``: each round a seeded ``fraction`` of each client's weight entries travels as
  its sign times the array's mean magnitude, with error feedback; no positions travel, both sides
  know the seed.
- ``low-rank``: PowerSGD's power iteration spread over rounds. The server holds an orthonormal
  basis of one side of every weight matrix (free on the downlink); clients send their update plus
  residual projected on it (``rank`` rows or columns, 4-bit), the next round's basis is the other
  side of the aggregate. Vectors go as ``random-mask`` at half their entries.
"""

from __future__ import annotations

import numpy as np

HEADER_BYTES = 16


def sign_times_mean(values: np.ndarray) -> np.ndarray:
    return (np.sign(values) * np.mean(np.abs(values))).astype(np.float32) if values.size \
        else values


def uniform(values: np.ndarray, bits: int, rng: np.random.Generator) -> np.ndarray:
    """Stochastic rounding to ``bits`` bits over the largest magnitude."""
    scale = float(np.max(np.abs(values))) if values.size else 0.0
    if scale == 0:
        return np.zeros_like(values)
    levels = (1 << bits) - 1
    units = (values / scale + 1) / 2 * levels
    code = np.clip(np.floor(units + rng.random(values.shape)), 0, levels)
    return scale * (2 * code / levels - 1)


def send_masked(names, changes, residual, fraction, rng, sent, kept) -> int:
    """A seeded ``fraction`` of each array's entries as signs times their mean magnitude, the rest
    kept for the next round; returns the bits."""
    bits = 0
    for name in names:
        corrected = (changes[name] + residual[name]).reshape(-1)
        mask = rng.random(corrected.size) < fraction
        decoded = np.zeros_like(corrected)
        decoded[mask] = sign_times_mean(corrected[mask])
        bits += int(mask.sum()) + 16
        sent[name] = decoded.reshape(changes[name].shape)
        kept[name] = (corrected - decoded).reshape(changes[name].shape)
    return bits


class ExactStatistics:
    """Adds the exact statistics of the model the server will hold (uncounted)."""

    def finish(self, mirror, client, sent, received, seed) -> dict[str, np.ndarray]:
        return {**sent, **mirror.statistics_change(sent, received, client, seed)}


class RandomMask(ExactStatistics):
    def __init__(self, mirror, options):
        self.mirror = mirror
        self.fraction = float(options.get("fraction", 0.18))
        self.shared = options.get("shared", "0") == "1"

    def __call__(self, client, changes, received, memory, seed):
        m = self.mirror
        residual = memory.get("residual") or {n: np.zeros_like(changes[n]) for n in m.trained}
        rng = np.random.default_rng([99, m.round, 0 if self.shared else client])
        sent, kept = {}, {}
        bits = send_masked(m.trained, changes, residual, self.fraction, rng, sent, kept)
        memory["residual"] = kept
        return self.finish(m, client, sent, received, seed), HEADER_BYTES + bits / 8


class LowRank(ExactStatistics):
    def __init__(self, mirror, options):
        self.mirror = mirror
        self.rank = int(options.get("rank", 2))
        self.matrices = {n: (mirror.initial[n].shape[0], int(np.prod(mirror.initial[n].shape[1:])))
                         for n in mirror.trained if mirror.initial[n].ndim >= 2}
        self.bases: dict[str, tuple[str, np.ndarray]] = {}
        self.aggregate: dict[str, np.ndarray] = {}
        self.basis_round = 0

    def _next_bases(self) -> None:
        """The server's step between rounds: orthonormalise the other side of the aggregate."""
        for name, (rows, columns) in self.matrices.items():
            rank = min(self.rank, rows, columns)
            if name not in self.bases:
                start = np.random.default_rng([7, len(self.bases)]).standard_normal((rows, rank))
                self.bases[name] = ("left", np.linalg.qr(start)[0])
                continue
            side, _ = self.bases[name]
            factor = self.aggregate[name]
            noise = np.random.default_rng(self.basis_round)  # keeps a zero factor full rank
            if side == "left":  # clients sent basis^T M (rank x columns)
                other = factor.T + 1e-12 * noise.standard_normal(factor.T.shape)
                self.bases[name] = ("right", np.linalg.qr(other)[0])
            else:  # clients sent M basis (rows x rank)
                other = factor + 1e-12 * noise.standard_normal(factor.shape)
                self.bases[name] = ("left", np.linalg.qr(other)[0])
        self.aggregate = {n: 0.0 for n in self.matrices}

    def __call__(self, client, changes, received, memory, seed):
        m = self.mirror
        if self.basis_round != m.round:
            self.basis_round = m.round
            self._next_bases()
        residual = memory.get("residual") or {n: np.zeros_like(changes[n]) for n in m.trained}
        rng = np.random.default_rng(seed)
        sent, kept, bits = {}, {}, 0
        for name, (rows, columns) in self.matrices.items():
            corrected = (changes[name] + residual[name]).reshape(rows, columns).astype(np.float64)
            side, basis = self.bases[name]
            factor = basis.T @ corrected if side == "left" else corrected @ basis
            factor = uniform(factor, 4, rng)
            decoded = basis @ factor if side == "left" else factor @ basis.T
            self.aggregate[name] = self.aggregate[name] + m.client_weights[client] * factor
            bits += 4 * factor.size + 16
            sent[name] = decoded.reshape(changes[name].shape).astype(np.float32)
            kept[name] = (corrected - decoded).reshape(changes[name].shape).astype(np.float32)
        vectors = [n for n in m.trained if n not in self.matrices]
        bits += send_masked(vectors, changes, residual, 0.5,
                            np.random.default_rng([99, m.round, client]), sent, kept)
        memory["residual"] = kept
        return self.finish(m, client, sent, received, seed), HEADER_BYTES + bits / 8


def build_candidate(name: str, mirror, options: dict[str, str]):
    candidates = {"random-mask": RandomMask, "low-rank": LowRank}
    if name not in candidates:
        raise SystemExit(f"candidate must be one of {', '.join(candidates)}, got {name!r}")
    return candidates[name](mirror, options)
