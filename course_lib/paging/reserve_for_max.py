"""The pre-vLLM allocator: one contiguous region per request, sized for the most it may need."""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.paging.allocator import KVAllocator, PoolExhausted


@dataclass(frozen=True)
class Region:
    """A contiguous run of slots ``[start, start + length)``; ``owner`` is None when free."""

    start: int
    length: int
    owner: str | None


class ReserveForMaxAllocator(KVAllocator):
    """Reserve ``min(max_model_len, prompt + max_tokens)`` contiguous slots at admission, first fit.

    The reservation is made up front because the final length is unknown, so the tail of
    the region sits idle (over-reservation) or is never used (internal fragmentation),
    and regions of different sizes leave holes between them (external fragmentation).
    """

    def __init__(self, capacity_tokens: int, max_model_len: int) -> None:
        super().__init__(capacity_tokens, max_model_len)
        self._spans: dict[str, tuple[int, int]] = {}  # req_id -> (start, length)

    def regions(self) -> list[Region]:
        """The whole pool, in address order, as used and free regions."""
        out, cursor = [], 0
        for req_id, (start, length) in sorted(self._spans.items(), key=lambda item: item[1][0]):
            if start > cursor:
                out.append(Region(cursor, start - cursor, None))
            out.append(Region(start, length, req_id))
            cursor = start + length
        if cursor < self.capacity_tokens:
            out.append(Region(cursor, self.capacity_tokens - cursor, None))
        return out

    def _holes(self) -> list[Region]:
        return [r for r in self.regions() if r.owner is None]

    def _fits(self, prompt_len: int, limit: int) -> bool:
        return any(hole.length >= limit for hole in self._holes())

    def slots_held(self, req_id: str) -> int:
        return self._spans[req_id][1]

    def stranded_slots(self) -> int:
        holes = [hole.length for hole in self._holes()]
        return sum(holes) - max(holes, default=0)

    def _allocate(self, req_id: str, prompt_len: int, limit: int) -> None:
        hole = next((h for h in self._holes() if h.length >= limit), None)
        if hole is None:
            raise PoolExhausted(f"No contiguous run of {limit} free slots for {req_id!r}.")
        self._spans[req_id] = (hole.start, limit)

    def _grow(self, req_id: str, new_length: int) -> None:
        if new_length > self._spans[req_id][1]:
            raise ValueError(
                f"Request {req_id!r} outgrew its reservation of {self._spans[req_id][1]} tokens; "
                f"admit it with a larger max_tokens."
            )

    def _release(self, req_id: str) -> None:
        del self._spans[req_id]
