"""vLLM's allocator: fixed-size blocks handed out on demand through a per-request block table."""

from __future__ import annotations

from collections import deque

from course_lib.checks import require_positive
from course_lib.paging.allocator import KVAllocator, PoolExhausted


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens (ceiling division)."""
    return -(-num_tokens // block_size)


class PagedAllocator(KVAllocator):
    """Hold ``ceil(length / block_size)`` blocks per request, anywhere in the pool.

    Invariant: each physical block belongs to at most one request, and a request's
    block table lists its blocks in logical order; only its last block can be partly empty.
    """

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        require_positive("num_blocks", num_blocks)
        require_positive("block_size", block_size)
        super().__init__(num_blocks * block_size, max_model_len)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    def owners(self) -> list[str | None]:
        """For each physical block, the request that holds it (None when free)."""
        owner: list[str | None] = [None] * self.num_blocks
        for req_id, table in self.block_tables.items():
            for block in table:
                owner[block] = req_id
        return owner

    def _fits(self, prompt_len: int, limit: int) -> bool:
        return blocks_for(prompt_len, self.block_size) <= len(self._free_blocks)

    def slots_held(self, req_id: str) -> int:
        return len(self.block_tables[req_id]) * self.block_size

    def stranded_slots(self) -> int:
        return 0  # any free block serves any request: paging has no external fragmentation

    def _take(self, count: int) -> list[int]:
        if count > len(self._free_blocks):
            raise PoolExhausted(f"Needed {count} free blocks, {len(self._free_blocks)} left.")
        return [self._free_blocks.popleft() for _ in range(count)]

    def _allocate(self, req_id: str, prompt_len: int, limit: int) -> None:
        self.block_tables[req_id] = self._take(blocks_for(prompt_len, self.block_size))

    def _grow(self, req_id: str, new_length: int) -> None:
        table = self.block_tables[req_id]
        if blocks_for(new_length, self.block_size) > len(table):
            table.extend(self._take(1))

    def _release(self, req_id: str) -> None:
        self._free_blocks.extend(self.block_tables.pop(req_id))
