"""Places every tensor of a compiled step in one arena, before anything is allocated.

Each tensor lives from the launch that first writes it to the launch that last reads it. Two tensors
may share bytes only if those intervals do not overlap. Placement is greedy by size (largest first,
each at the lowest offset that does not collide with an already-placed tensor that is alive at the
same time), the strategy TFLite's GPU delegate uses for its shared buffers. The peak is then known
exactly, which is what memory-aware batch sizing needs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorRequest:
    """A tensor to place: ``nbytes`` alive over launch positions ``[first, last]`` inclusive."""

    name: str
    nbytes: int
    first: int
    last: int
    category: str = "activations"

    def overlaps_in_time(self, other: TensorRequest) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Placement:
    request: TensorRequest
    offset: int

    @property
    def end(self) -> int:
        return self.offset + self.request.nbytes


@dataclass
class MemoryPlan:
    placements: dict[str, Placement]
    peak_bytes: int
    alignment: int

    def offset(self, name: str) -> int:
        return self.placements[name].offset

    def bytes_by_category(self) -> dict[str, int]:
        """Bytes each category would take if nothing were shared (the breakdown a user reads)."""
        totals: dict[str, int] = {}
        for placement in self.placements.values():
            req = placement.request
            totals[req.category] = totals.get(req.category, 0) + req.nbytes
        return totals

    def breakdown_at_peak(self) -> dict[str, int]:
        """Bytes by category of the tensors alive at the busiest launch, plus ``fragmentation``:
        what the arena needs beyond them because sizes do not tile perfectly."""
        events: dict[int, int] = {}
        for p in self.placements.values():
            events[p.request.first] = events.get(p.request.first, 0)
        busiest, best = 0, -1
        for t in sorted(events):
            live = sum(
                align_up(p.request.nbytes, self.alignment)
                for p in self.placements.values()
                if p.request.first <= t <= p.request.last
            )
            if live > best:
                busiest, best = t, live
        totals: dict[str, int] = {}
        for p in self.placements.values():
            if p.request.first <= busiest <= p.request.last:
                cat = p.request.category
                totals[cat] = totals.get(cat, 0) + align_up(p.request.nbytes, self.alignment)
        totals["fragmentation"] = self.peak_bytes - max(best, 0)
        return totals

    def check_no_live_overlap(self) -> None:
        """Raise if two tensors alive at the same time share a byte (a planner bug)."""
        items = sorted(self.placements.values(), key=lambda p: p.offset)
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                if b.offset >= a.end:
                    break
                if a.request.overlaps_in_time(b.request):
                    raise AssertionError(
                        f"{a.request.name} and {b.request.name} overlap while alive"
                    )


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def plan_memory(requests: list[TensorRequest], alignment: int = 256) -> MemoryPlan:
    """Greedy-by-size placement; every offset is a multiple of ``alignment`` (sub-buffer origins
    must respect the device's base-address alignment)."""
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    order = sorted(requests, key=lambda r: (-r.nbytes, r.first, r.name))
    placed: list[Placement] = []
    for req in order:
        size = align_up(max(req.nbytes, 1), alignment)
        conflicts = sorted(
            (p for p in placed if p.request.overlaps_in_time(req)), key=lambda p: p.offset
        )
        offset = 0
        for other in conflicts:
            if offset + size <= other.offset:
                break
            offset = max(offset, align_up(other.end, alignment))
        placed.append(Placement(req, offset))
    peak = max((align_up(p.end, alignment) for p in placed), default=0)
    return MemoryPlan({p.request.name: p for p in placed}, peak, alignment)
