"""Weight codings tried against stc in ``torch_mirror.py`` and dropped (worse at the same bytes),
kept so that the comparison can be run again. Their bytes are counted from what they would
send (payload bits plus one bfloat16 scale per array and a 16-byte header), not from a wire
format; their BatchNorm statistics arrive exact and uncounted, so compare them with
``torch_mirror.py codec=stc:0.023 statistics=exact`` (measured 2026-11-30 on the H200, seed 0:
stc 2.3% 89.3% after 20 rounds; random-mask fraction=0.18, a seeded 18% of the entries on each
client as one sign bit each, 83.3% at 593 bytes; the same entries on every client (shared=1)
80.3%; low-rank rank=2 46.3% at 638 bytes; rows in benchmarks/h200-2026-11-30-mirror/).

Tried on 2026-12-01 (same machine; rows in benchmarks/h200-2026-12-01-mirror/, figures in
docs/federated.md), none better than stc at the same bytes:

- ``exact-topk``: a diagnostic, stc's selection with exact values (``levels=L``: L magnitudes
  per array instead); shows that stc loses by selecting too few entries, not by its magnitudes.
- ``server-mask``: positions the server picks from earlier rounds' aggregates travel free on the
  downlink; clients send a sign (or ``bits``) for each and an stc section of their own.
- ``block-stc``: blocks of ``block`` neighbouring entries share one position.
- ``context-coded``: stc, with the ideal adaptive code length of its positions under contexts
  both sides know (array, own last positions, quantile of the global model's last change);
  ``report`` gives every context model's bytes.
- ``normalized-stc``: top-k ranked against each array's own root mean square.
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

from mgfl.codecs.compact import statistic_scale
from mgfl.codecs.ternary import encode_section
from mgfl.codecs.topk import entries_to_send

HEADER_BYTES = 16


def corrected_flats(mirror, changes, memory) -> list[np.ndarray]:
    """Each trained array's change plus the client's residual (none yet: zero), flattened."""
    residual = memory.get("residual") or {}
    return [(changes[n] + residual[n] if n in residual else changes[n]).reshape(-1)
            for n in mirror.trained]


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


def dithered(values: np.ndarray, bits: int, rng: np.random.Generator) -> np.ndarray:
    """``bits``-bit codes with subtractive dither over the compact bundle's clipped statistics
    scale (``statistic_scale``); one bit is the sign times the mean magnitude."""
    if bits == 1 or not values.size:
        return sign_times_mean(values)
    scale = statistic_scale(values.astype(np.float64))
    if scale == 0:
        return np.zeros_like(values)
    levels = (1 << bits) - 1
    shift = rng.random(values.shape) - 0.5
    units = (np.clip(values / scale, -1, 1) + 1) / 2 * levels
    code = np.clip(np.round(units + shift), 0, levels)
    return (scale * (2 * (code - shift) / levels - 1)).astype(np.float32)


class ServerMask(ExactStatistics):
    """Positions chosen by the server, which the free downlink carries: the ``mask`` fraction of
    entries where the aggregated updates moved most (an average over rounds, ``beta``), each
    normalised by its array's root mean square. Every client sends ``bits`` bits for each of
    them (no positions travel) and an stc section of its ``own`` largest entries elsewhere;
    round 1 has no mask and sends stc at ``first``. Error feedback over everything."""

    def __init__(self, mirror, options):
        self.mirror = mirror
        self.mask_fraction = float(options.get("mask", 0.1))
        self.own = float(options.get("own", 0.01))
        self.first = float(options.get("first", 0.023))
        self.beta = float(options.get("beta", 0.5))
        self.bits = int(options.get("bits", 1))
        self.normalize = options.get("normalize", "1") == "1"
        self.sizes = [int(mirror.initial[n].size) for n in mirror.trained]
        self.bounds = np.concatenate([[0], np.cumsum(self.sizes)])
        self.average = None
        self.aggregate = np.zeros(self.bounds[-1])
        self.mask = None
        self.mask_round = 0

    def _next_mask(self) -> None:
        if self.mirror.round == 1:
            return
        moved = np.abs(self.aggregate)
        self.average = moved if self.average is None else \
            self.beta * self.average + (1 - self.beta) * moved
        score = self.average.copy()
        if self.normalize:
            for start, end in zip(self.bounds[:-1], self.bounds[1:], strict=True):
                rms = np.sqrt(np.mean(score[start:end] ** 2))
                score[start:end] = score[start:end] / rms if rms > 0 else 0
        count = int(self.mask_fraction * score.size)
        chosen = np.argpartition(score, score.size - count)[score.size - count:]
        self.mask = np.zeros(score.size, bool)
        self.mask[chosen] = True
        self.aggregate = np.zeros_like(self.aggregate)

    def __call__(self, client, changes, received, memory, seed):
        m = self.mirror
        if self.mask_round != m.round:
            self.mask_round = m.round
            self._next_mask()
        corrected = np.concatenate(corrected_flats(m, changes, memory))
        rng = np.random.default_rng(seed)
        sent = np.zeros_like(corrected)
        bits = 0
        rest, fraction = corrected, self.first
        if self.mask is not None:
            for start, end in zip(self.bounds[:-1], self.bounds[1:], strict=True):
                chosen = self.mask[start:end]
                if chosen.any():
                    sent[start:end][chosen] = dithered(corrected[start:end][chosen], self.bits,
                                                       rng)
                    bits += self.bits * int(chosen.sum()) + 16
            rest, fraction = np.where(self.mask, 0, corrected), self.own
        k = entries_to_send(rest.size, fraction, rng)
        if k:
            payload, decoded = encode_section(np.split(rest, self.bounds[1:-1]), k)
            sent += np.concatenate(decoded)
            bits += 8 * len(payload)
        self.aggregate += m.client_weights[client] * sent
        kept = corrected - sent
        memory["residual"] = {n: kept[s:e].reshape(changes[n].shape) for n, s, e in
                              zip(m.trained, self.bounds[:-1], self.bounds[1:], strict=True)}
        out = {n: sent[s:e].reshape(changes[n].shape).astype(np.float32) for n, s, e in
               zip(m.trained, self.bounds[:-1], self.bounds[1:], strict=True)}
        return self.finish(m, client, out, received, seed), HEADER_BYTES + bits / 8


class NormalizedTernary(ExactStatistics):
    """stc whose top-k ranks each entry against its own array's root mean square, so that
    arrays with small updates (biases, BatchNorm's scales) are not starved; bytes as stc's."""

    def __init__(self, mirror, options):
        self.mirror = mirror
        self.fraction = float(options.get("fraction", 0.023))

    def __call__(self, client, changes, received, memory, seed):
        m = self.mirror
        corrected = corrected_flats(m, changes, memory)
        scales = [float(np.sqrt(np.mean(c.astype(np.float64) ** 2))) or 1.0 for c in corrected]
        k = entries_to_send(sum(c.size for c in corrected), self.fraction,
                            np.random.default_rng(seed))
        payload, decoded = encode_section([c / s for c, s in zip(corrected, scales,
                                                                 strict=True)], k)
        sent, kept = {}, {}
        for name, c, d, s in zip(m.trained, corrected, decoded, scales, strict=True):
            sent[name] = (d * s).reshape(changes[name].shape).astype(np.float32)
            kept[name] = (c - d * s).reshape(changes[name].shape)
        memory["residual"] = kept
        return self.finish(m, client, sent, received, seed), HEADER_BYTES + len(payload)


class ExactTopK(ExactStatistics):
    """Diagnostic: the ``fraction`` largest entries with their exact values (bytes uncounted:
    reported as stc's would be), to split stc's loss into selection and magnitudes."""

    def __init__(self, mirror, options):
        self.mirror = mirror
        self.fraction = float(options.get("fraction", 0.023))
        self.levels = int(options.get("levels", 0))  # 0: exact; L: L magnitudes per array

    def __call__(self, client, changes, received, memory, seed):
        m = self.mirror
        corrected = corrected_flats(m, changes, memory)
        k = entries_to_send(sum(c.size for c in corrected), self.fraction,
                            np.random.default_rng(seed))
        payload, decoded = encode_section(corrected, k)
        sent, kept = {}, {}
        for name, c, d in zip(m.trained, corrected, decoded, strict=True):
            chosen = d != 0
            value = np.zeros_like(c)
            value[chosen] = c[chosen]
            if self.levels and chosen.any():
                value[chosen] = grouped_magnitudes(c[chosen], self.levels)
            sent[name] = value.reshape(changes[name].shape)
            kept[name] = (c - value).reshape(changes[name].shape)
        memory["residual"] = kept
        extra = 0 if not self.levels else (np.log2(self.levels) * k + 2 * self.levels *
                                            len(m.trained)) / 8
        return self.finish(m, client, sent, received, seed), HEADER_BYTES + len(payload) + extra


def grouped_magnitudes(values: np.ndarray, levels: int) -> np.ndarray:
    """Signs times the mean magnitude of each of ``levels`` equal-count magnitude groups."""
    magnitude = np.abs(values)
    order = np.argsort(magnitude)
    out = np.empty_like(values)
    for group in np.array_split(order, levels):
        if group.size:
            out[group] = np.sign(values[group]) * magnitude[group].mean()
    return out


def kt_bits(ones: np.ndarray, total: np.ndarray) -> float:
    """Adaptive (Krichevsky-Trofimov) code length of binary sequences with these counts."""
    from scipy.special import gammaln

    ones, zeros = np.asarray(ones, np.float64), np.asarray(total - ones, np.float64)
    nats = gammaln(ones + 0.5) + gammaln(zeros + 0.5) - np.log(np.pi) - gammaln(ones + zeros + 1)
    return float(-nats.sum() / np.log(2))


class ContextCoded(ExactStatistics):
    """stc's selection and values, with the positions' bits measured under context models both
    sides could share (each as adaptive KT coding of the selection bitmap): the array, whether
    the client sent the entry in its last rounds, and the quantile of the global model's last
    change at the entry. Reports bytes under ``model``; logs every model's bits."""

    def __init__(self, mirror, options):
        self.mirror = mirror
        self.fraction = float(options.get("fraction", 0.023))
        self.model = options.get("model", "rice")
        self.sizes = [int(mirror.initial[n].size) for n in mirror.trained]
        self.bounds = np.concatenate([[0], np.cumsum(self.sizes)])
        self.tensor_id = np.repeat(np.arange(len(self.sizes)), self.sizes)
        self.aggregate = np.zeros(self.bounds[-1])
        self.last_change = None
        self.change_round = 0
        self.history: dict[int, list[np.ndarray]] = {}
        self.totals: dict[str, float] = {}

    def _buckets(self) -> np.ndarray:
        if self.last_change is None:
            return np.zeros(self.bounds[-1], np.int64)
        out = np.zeros(self.bounds[-1], np.int64)
        for start, end in zip(self.bounds[:-1], self.bounds[1:], strict=True):
            part = np.abs(self.last_change[start:end])
            ranks = np.argsort(np.argsort(part, kind="stable"), kind="stable")
            out[start:end] = (4 * ranks) // max(end - start, 1)
        return out

    def __call__(self, client, changes, received, memory, seed):
        m = self.mirror
        if self.change_round != m.round:
            if self.change_round:
                self.last_change = self.aggregate
            self.aggregate = np.zeros(self.bounds[-1])
            self.change_round = m.round
        corrected = corrected_flats(m, changes, memory)
        k = entries_to_send(sum(c.size for c in corrected), self.fraction,
                            np.random.default_rng(seed))
        payload, decoded = encode_section(corrected, k)
        flat = np.concatenate(decoded)
        chosen = flat != 0
        past = self.history.get(client, [])
        last = past[-1] if past else np.zeros_like(chosen)
        twice = (last.astype(np.int64) + (past[-2] if len(past) > 1 else 0))
        bucket = self._buckets()
        tensors = len(self.sizes)
        contexts = {
            "one": np.zeros_like(self.tensor_id),
            "tensor": self.tensor_id,
            "tensor-last": self.tensor_id * 2 + last,
            "tensor-bucket": self.tensor_id * 4 + bucket,
            "tensor-last-bucket": (self.tensor_id * 2 + last) * 4 + bucket,
            "last-bucket": last * 4 + bucket,
            "tensor-twice-bucket": (self.tensor_id * 3 + twice) * 4 + bucket,
        }
        count = int(chosen.sum())
        overhead = 8 * (len(payload) - 1)  # stc's Rice positions and signs, less the parameter
        value_bits = count + 16 * len(np.unique(self.tensor_id[chosen]))
        bits = {"rice": overhead + 8}
        for name, context in contexts.items():
            size = int(context.max()) + 1 if context.size else 1
            ones = np.bincount(context[chosen], minlength=size)
            total = np.bincount(context, minlength=size)
            bits[name] = kt_bits(ones, total) + value_bits
        del tensors
        for name, value in bits.items():
            self.totals[name] = self.totals.get(name, 0.0) + value / 8 + HEADER_BYTES
        self.totals["messages"] = self.totals.get("messages", 0) + 1
        self.history[client] = (past + [chosen])[-2:]
        self.aggregate += m.client_weights[client] * flat
        sent = {n: decoded[i].reshape(changes[n].shape) for i, n in enumerate(m.trained)}
        memory["residual"] = {n: (corrected[i] - decoded[i]).reshape(changes[n].shape)
                              for i, n in enumerate(m.trained)}
        return self.finish(m, client, sent, received, seed), HEADER_BYTES + bits[self.model] / 8

    def report(self) -> dict[str, float]:
        messages = self.totals.get("messages", 1)
        return {n: round(v / messages, 1) for n, v in self.totals.items() if n != "messages"}


class BlockTernary(ExactStatistics):
    """stc over blocks of ``block`` consecutive entries of an array: the blocks of largest
    energy travel as one position and a sign per entry, so a position is paid once a block."""

    def __init__(self, mirror, options):
        self.mirror = mirror
        self.fraction = float(options.get("fraction", 0.012))  # of the blocks
        self.block = int(options.get("block", 4))

    def __call__(self, client, changes, received, memory, seed):
        m, b = self.mirror, self.block
        corrected = corrected_flats(m, changes, memory)
        energies, padded = [], []
        for c in corrected:
            full = np.zeros(-(-c.size // b) * b, np.float32)
            full[:c.size] = c
            padded.append(full)
            energies.append(np.sqrt(np.sum(full.reshape(-1, b) ** 2, axis=1)))
        k = entries_to_send(sum(e.size for e in energies), self.fraction,
                            np.random.default_rng(seed))
        payload, decoded = encode_section(energies, k)
        sent, kept, chosen_entries = {}, {}, 0
        for name, c, full, d in zip(m.trained, corrected, padded, decoded, strict=True):
            mask = np.repeat(d != 0, b)
            value = np.zeros_like(full)
            if mask.any():
                value[mask] = sign_times_mean(full[mask])
                chosen_entries += int(mask.sum())
            value = value[:c.size]
            sent[name] = value.reshape(changes[name].shape)
            kept[name] = (c - value).reshape(changes[name].shape)
        memory["residual"] = kept
        extra_signs = chosen_entries - len(np.flatnonzero(np.concatenate(decoded)))
        return (self.finish(m, client, sent, received, seed),
                HEADER_BYTES + len(payload) + extra_signs / 8)


def build_candidate(name: str, mirror, options: dict[str, str]):
    candidates = {"random-mask": RandomMask, "low-rank": LowRank, "server-mask": ServerMask,
                  "normalized-stc": NormalizedTernary, "exact-topk": ExactTopK,
                  "context-coded": ContextCoded, "block-stc": BlockTernary}
    if name not in candidates:
        raise SystemExit(f"candidate must be one of {', '.join(candidates)}, got {name!r}")
    return candidates[name](mirror, options)
