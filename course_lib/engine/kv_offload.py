"""The KV offload tier: prefix-cache blocks evicted from the GPU pool live on in a CPU pool.

When the block pool reuses a free block that still names a cached prefix (lazy eviction), the
block's KV is first copied to a CPU block of this pool instead of being forgotten. A later
prefix lookup that misses on the GPU asks this pool next: a hit is copied back into a fresh GPU
block (a *reload*), which is then cached on the GPU again under the same hash, so the prefix
is not recomputed. The CPU copy stays too (the tiers overlap), so evicting that GPU block
again needs no second copy.

Invariants a reader must keep:
  * a CPU block is either free or holds exactly one hash; ``num_free + len(cached) + len(pinned)``
    is always ``num_blocks``;
  * the pool is full before it forgets anything, and then it forgets the least recently used
    hash (stored or reloaded longest ago); every operation is O(1) (one ordered dict);
  * a CPU block read by a reload this step is *pinned*: no offload may overwrite it until the
    step's copies are handed to the model runner (``take_transfers``); if every block is pinned,
    an eviction is simply not offloaded (this is a cache, never a correctness tier);
  * copies are applied by the model runner before the forward pass: all GPU->CPU offloads
    first (they read GPU blocks popped for reuse this step, before anything writes them), then
    the CPU->GPU reloads. Offloads are handed over one per CPU block (the last wins), so a block
    that held two hashes within one step gets the one it holds now.
Block hashes already carry the request's ``cache_salt`` (in the first block, so in the whole
chain), so one tenant's offloaded blocks can never serve another tenant's lookup.

How vLLM V1 differs: its CPU offloading (the ``OffloadingConnector`` KV connector, configured by
``kv_transfer_config`` with ``num_cpu_blocks`` / ``cpu_bytes_to_use``, or ``--kv-offloading-size``
in GiB with ``--kv-offloading-backend native``) *stores* each full block to CPU soon after it is
computed, on separate CUDA streams that overlap the forward passes, instead of waiting for the
block's eviction as here. Like this tier it looks up the CPU side on a GPU prefix-cache miss and
evicts there in LRU order (ARC is an option), but it loads asynchronously: the request waits
for its blocks while other requests run. Here every copy is synchronous, inside the step that
needs it; only blocks that are actually evicted cost a GPU->CPU copy, but that copy is paid at
eviction time, by whichever step reuses the block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from course_lib.engine.block_hash import BlockHash


@dataclass(frozen=True, slots=True)
class OffloadedBlock:
    """A prefix-lookup hit on the CPU tier: the block named by ``block_hash`` must be reloaded."""

    block_hash: BlockHash


class KVOffloadPool:
    """CPU block ids, which hash each holds (LRU order), and this step's pending copies."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"An offload pool needs at least one block, got {num_blocks}; pass "
                             "kv_offload_blocks=None (or 0) to turn offloading off.")
        self.num_blocks = num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.cached: OrderedDict[BlockHash, int] = OrderedDict()  # least recently used first
        self.pinned: dict[BlockHash, int] = {}  # read by a reload this step: out of eviction's reach
        self._offloads: dict[int, int] = {}  # cpu block -> gpu block, this step
        self._reloads: list[tuple[int, int]] = []  # (cpu block, gpu block), this step
        self.num_offloaded_blocks = 0  # GPU->CPU copies
        self.num_reloaded_blocks = 0  # CPU->GPU copies
        self.num_dropped_blocks = 0  # hashes the CPU pool forgot to make room

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The CPU block holding ``block_hash``, or None."""
        cpu = self.cached.get(block_hash)
        return self.pinned.get(block_hash) if cpu is None else cpu

    def offload(self, block_hash: BlockHash, gpu_block_id: int) -> bool:
        """Keep a copy of GPU block ``gpu_block_id`` (about to be reused) under ``block_hash``.
        False when nothing needs copying (already stored) or no CPU block can be freed."""
        if block_hash in self.cached:
            self.cached.move_to_end(block_hash)  # refreshed: the same KV, no second copy
            return False
        if block_hash in self.pinned:
            return False
        if self.free_ids:
            cpu = self.free_ids.popleft()
        elif self.cached:
            _, cpu = self.cached.popitem(last=False)  # forget the least recently used
            self.num_dropped_blocks += 1
        else:
            return False  # every CPU block is being read this step
        self.cached[block_hash] = cpu
        self._offloads[cpu] = gpu_block_id  # a later offload to the same block this step wins
        return True

    def pin(self, block_hash: BlockHash) -> int:
        """Reserve the CPU block holding ``block_hash`` for a reload this step; returns its id."""
        cpu = self.cached.pop(block_hash, None)
        if cpu is None:
            cpu = self.pinned.get(block_hash)
            if cpu is None:
                raise KeyError("A reload asked for a block the offload pool does not hold.")
        self.pinned[block_hash] = cpu
        return cpu

    def reload(self, cpu_block_id: int, gpu_block_id: int) -> None:
        """Copy pinned CPU block ``cpu_block_id`` into GPU block ``gpu_block_id`` this step."""
        self._reloads.append((cpu_block_id, gpu_block_id))
        self.num_reloaded_blocks += 1

    def forget(self, cpu_block_ids) -> None:
        """Free these CPU blocks and forget their hashes: their step failed, perhaps before the
        runner copied into them, so no later lookup may find them (between steps)."""
        lost = set(cpu_block_ids)
        for block_hash, cpu in [(h, c) for h, c in self.cached.items() if c in lost]:
            del self.cached[block_hash]
            self.free_ids.append(cpu)

    def clear(self) -> None:
        """Forget every stored hash (between steps: nothing pinned or pending)."""
        self.free_ids = deque(range(self.num_blocks))
        self.cached.clear()

    def take_transfers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This step's copies, ``(offloads as (gpu, cpu), reloads as (cpu, gpu))``, in the order the
        runner must apply them; unpins the reloaded blocks (they become most recently used)."""
        offloads = [(gpu, cpu) for cpu, gpu in self._offloads.items()]
        reloads = self._reloads
        self.num_offloaded_blocks += len(offloads)  # copies made: one per CPU block, the last store wins
        self._offloads, self._reloads = {}, []
        for block_hash, cpu in self.pinned.items():
            self.cached[block_hash] = cpu
        self.pinned.clear()
        return offloads, reloads
