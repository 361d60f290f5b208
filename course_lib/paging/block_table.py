"""Block tables with reference counts and copy-on-write, for parallel sampling and beams.

Sequences map logical blocks to physical ones. ``fork`` lets a child share every block of
its parent (reference counts rise, nothing is copied). A write into a shared block first
copies it to a private block (copy-on-write), so siblings never see each other's tokens.
Invariant: a physical block's reference count equals the number of block tables that
list it, and a block is free exactly when its count is 0.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from course_lib.checks import require_positive
from course_lib.paging.allocator import PoolExhausted
from course_lib.paging.paged import blocks_for


class CopyOnWriteBlockTables:
    """Physical KV blocks (holding real token ids) shared between sequences by reference count."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        require_positive("num_blocks", num_blocks)
        require_positive("block_size", block_size)
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._contents: list[list[int]] = [[] for _ in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}
        self.copies: list[tuple[int, int]] = []  # (source block, new block) per copy-on-write

    @property
    def num_used_blocks(self) -> int:
        return len(self.ref_counts) - len(self._free)

    def _take(self) -> int:
        if not self._free:
            raise PoolExhausted("No free KV block left; free a sequence or give the pool more blocks.")
        block = self._free.popleft()
        self.ref_counts[block] = 1
        self._contents[block] = []
        return block

    def _drop(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)

    def _table(self, seq_id: str) -> list[int]:
        try:
            return self.block_tables[seq_id]
        except KeyError:
            raise KeyError(f"Sequence {seq_id!r} does not exist here.") from None

    def add_sequence(self, seq_id: str, token_ids: list[int]) -> None:
        """Create a sequence holding ``token_ids`` (a prompt) in fresh blocks."""
        if seq_id in self.block_tables:
            raise ValueError(f"Sequence {seq_id!r} already exists; pick a new id.")
        if len(self._free) < blocks_for(len(token_ids), self.block_size):
            raise PoolExhausted(f"Not enough free blocks for the {len(token_ids)}-token sequence {seq_id!r}.")
        self.block_tables[seq_id] = []
        for token in token_ids:
            self.append_token(seq_id, token)

    def fork(self, parent_id: str, child_id: str) -> None:
        """Make ``child_id`` share all of ``parent_id``'s blocks (no copy)."""
        if child_id in self.block_tables:
            raise ValueError(f"Sequence {child_id!r} already exists; pick a new id.")
        table = list(self._table(parent_id))
        for block in table:
            self.ref_counts[block] += 1
        self.block_tables[child_id] = table

    def append_token(self, seq_id: str, token_id: int) -> tuple[int, int] | None:
        """Write one token at the end of ``seq_id``; return ``(source, copy)`` if a block was copied."""
        table = self._table(seq_id)
        copied = None
        if not table or len(self._contents[table[-1]]) == self.block_size:
            table.append(self._take())
        elif self.ref_counts[table[-1]] > 1:
            shared = table[-1]
            private = self._take()
            self._contents[private] = list(self._contents[shared])
            self._drop(shared)
            table[-1] = private
            copied = (shared, private)
            self.copies.append(copied)
        self._contents[table[-1]].append(token_id)
        return copied

    def tokens(self, seq_id: str) -> list[int]:
        """The sequence's token ids, read back through its block table."""
        return [token for block in self._table(seq_id) for token in self._contents[block]]

    def free(self, seq_id: str) -> None:
        """Drop a sequence; blocks nobody else references return to the free pool."""
        for block in self._table(seq_id):
            self._drop(block)
        del self.block_tables[seq_id]


@dataclass(frozen=True)
class SharingReport:
    """Blocks used by ``num_samples`` samples of one prompt, shared versus copied per sample."""

    num_samples: int
    shared_blocks: int
    unshared_blocks: int
    copy_on_writes: int

    @property
    def saved_fraction(self) -> float:
        """Share of the per-sample-copy memory that sharing saves."""
        return 1 - self.shared_blocks / self.unshared_blocks


def run_parallel_sampling(
    prompt_len: int, num_samples: int, output_len: int, block_size: int = 16
) -> CopyOnWriteBlockTables:
    """Fork ``num_samples`` samples from one prompt and let each write ``output_len`` different tokens.

    Samples write in turn, one token each per step, as a batched decode would; the tables
    are returned as they stand at the end of generation (sequences ``sample0``...).
    """
    for name, value in (("prompt_len", prompt_len), ("num_samples", num_samples), ("output_len", output_len)):
        require_positive(name, value)
    per_sample = blocks_for(prompt_len + output_len, block_size)
    tables = CopyOnWriteBlockTables(num_samples * per_sample, block_size)
    tables.add_sequence("sample0", list(range(prompt_len)))
    for i in range(1, num_samples):
        tables.fork("sample0", f"sample{i}")
    for step in range(output_len):
        for i in range(num_samples):
            tables.append_token(f"sample{i}", 100_000 * (i + 1) + step)  # every sample diverges
    return tables


def parallel_sampling_report(
    prompt_len: int, num_samples: int, output_len: int, block_size: int = 16
) -> SharingReport:
    """Blocks held at the end of parallel sampling, versus each sample copying the prompt."""
    tables = run_parallel_sampling(prompt_len, num_samples, output_len, block_size)
    unshared = num_samples * blocks_for(prompt_len + output_len, block_size)
    return SharingReport(num_samples, tables.num_used_blocks, unshared, len(tables.copies))
