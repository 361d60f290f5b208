"""Where the KV memory goes: tokens stored versus the kinds of waste.

For a live request that holds ``A`` slots, stores ``T`` tokens now and will finish at
``F`` tokens (``T <= F``):
  over-reservation        = min(A, F) - T   slots held now for tokens still to come
  internal fragmentation  = max(A - F, 0)   slots it will never use
and for the pool, external fragmentation = free slots outside the largest free run.
Waste is the share of occupied-or-stranded memory that holds no token.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.paging.allocator import KVAllocator


@dataclass(frozen=True)
class MemoryReport:
    """A snapshot of one allocator, in token slots."""

    capacity: int
    num_requests: int
    tokens_stored: int
    slots_held: int
    over_reservation: int
    internal_fragmentation: int
    external_fragmentation: int

    @property
    def wasted(self) -> int:
        """Slots that hold no token but are not available for a new request."""
        return self.over_reservation + self.internal_fragmentation + self.external_fragmentation

    @property
    def waste_fraction(self) -> float:
        """Wasted slots over wasted plus used slots (0 when nothing is held)."""
        total = self.tokens_stored + self.wasted
        return self.wasted / total if total else 0.0


def measure(allocator: KVAllocator, final_lengths: dict[str, int]) -> MemoryReport:
    """Account for every slot of ``allocator``; ``final_lengths`` gives each live request's end length."""
    over = internal = held = 0
    for req_id, length in allocator.lengths.items():
        slots = allocator.slots_held(req_id)
        final = final_lengths[req_id]
        if final < length:
            raise ValueError(f"Request {req_id!r} holds {length} tokens, past its final length {final}.")
        held += slots
        over += min(slots, final) - length
        internal += max(slots - final, 0)
    return MemoryReport(
        capacity=allocator.capacity_tokens,
        num_requests=len(allocator.lengths),
        tokens_stored=sum(allocator.lengths.values()),
        slots_held=held,
        over_reservation=over,
        internal_fragmentation=internal,
        external_fragmentation=allocator.stranded_slots(),
    )
