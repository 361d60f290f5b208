"""The block pool: every KV block, its reference count, the LRU free queue and the prefix cache.

Invariants (checked by the property tests):
  * a block is in the free queue exactly when its ``ref_cnt`` is 0;
  * a block keeps its hash after it is freed, and stays findable in the prefix cache until it
    is popped from the free queue for reuse (lazy eviction);
  * the free queue is ordered for eviction (popped from the head). A freed block that holds a
    cached hash joins the *tail*: least recently freed first, and within one freed request the
    tail blocks first (they are the least likely to be shared). A freed block without a hash
    (a partial block, or every block when caching is off) joins the *head*: it holds nothing
    worth keeping, so it is reused at once and never pushes a cached prefix out of LRU order.
    This is current vLLM V1's ``free_blocks``; earlier V1 releases appended every freed block;
  * two blocks may hold the same hash (two requests computed the same block independently:
    identical block-aligned prompts, ``n > 1`` siblings, a recompute after preemption). The cache
    keeps every copy, keyed by hash then block id, as vLLM does; a lookup returns one of them,
    and evicting one copy leaves the others findable;
  * all queue and cache operations are O(1) (a doubly linked list through the blocks themselves),
    and so is creating a pool of any size: each block object is made when it is first handed out
    (``FreeKVCacheBlockQueue``);
  * with an offload pool (``engine/kv_offload.py``), evicting the *last* GPU copy of a hash first
    queues a copy of it to the CPU tier, so the hash stays findable there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_lib.engine.block_hash import BlockHash
from course_lib.engine.kv_offload import KVOffloadPool


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free: "KVCacheBlock | None" = field(default=None, repr=False)
    next_free: "KVCacheBlock | None" = field(default=None, repr=False)


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks with O(1) append, prepend, popleft and remove-from-the-middle.

    It starts as every block in id order, as vLLM's does, but makes each block object only when
    ``popleft`` first reaches it: the blocks never handed out, ids ``len(created) .. num_blocks - 1``,
    wait as one run at the place of the ``_unused`` node (ahead of every block appended since,
    behind every block prepended since). Popping, iterating and counting see exactly the queue an
    up-front list of every block would give. ``created`` holds the blocks made so far, by id.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.created: list[KVCacheBlock] = []
        self._head, self._unused, self._tail = KVCacheBlock(-1), KVCacheBlock(-1), KVCacheBlock(-1)
        self._head.next_free, self._unused.prev_free = self._unused, self._head
        self._unused.next_free, self._tail.prev_free = self._tail, self._unused
        self.num_free_blocks = num_blocks

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free_blocks += 1

    def remove(self, block: KVCacheBlock) -> None:
        block.prev_free.next_free, block.next_free.prev_free = block.next_free, block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, in the given order (``blocks[0]`` is popped next)."""
        for block in reversed(blocks):
            first = self._head.next_free
            self._head.next_free, block.prev_free = block, self._head
            block.next_free, first.prev_free = first, block
        self.num_free_blocks += len(blocks)

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("No free block left; the caller must check num_free_blocks first.")
        block = self._head.next_free
        if block is not self._unused:
            self.remove(block)
            return block
        block = KVCacheBlock(len(self.created))
        self.created.append(block)
        self.num_free_blocks -= 1
        if len(self.created) == self.num_blocks:  # the run is used up: unlink its marker
            self._head.next_free, self._unused.next_free.prev_free = self._unused.next_free, self._head
        return block

    def create_all(self) -> None:
        """Make every block not made yet and link the run in place of the ``_unused`` node."""
        if len(self.created) == self.num_blocks:
            return
        last = self._unused.prev_free
        for block_id in range(len(self.created), self.num_blocks):
            block = KVCacheBlock(block_id, prev_free=last)
            last.next_free = block
            self.created.append(block)
            last = block
        last.next_free, self._unused.next_free.prev_free = self._unused.next_free, last

    def __iter__(self):
        self.create_all()
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free


class BlockPool:
    """Hands out blocks, takes them back, and remembers which full blocks hold which prefix."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, offload: KVOffloadPool | None = None) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}; give the KV cache more memory.")
        self.num_blocks = num_blocks
        self.free_block_queue = FreeKVCacheBlockQueue(num_blocks)
        self.enable_caching = enable_caching
        # hash -> {block id: block}: every GPU block that holds that hash (usually exactly one)
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        self.offload = offload  # where evicted cached blocks go, or None: forgotten

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """Every block, by id. Makes the blocks never handed out yet, O(num_blocks) the first time:
        to count them, read ``num_blocks``."""
        self.free_block_queue.create_all()
        return self.free_block_queue.created

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """A block holding ``block_hash`` (the first cached, when several do), or None."""
        copies = self.cached_block_hash_to_block.get(block_hash) if self.enable_caching else None
        return next(iter(copies.values())) if copies else None

    def get_new_blocks(self, count: int) -> list[KVCacheBlock]:
        """Pop ``count`` blocks from the free queue's head, evicting any cached prefix they held."""
        if count > self.num_free_blocks:
            raise ValueError(f"Asked for {count} blocks with {self.num_free_blocks} free; check first.")
        blocks = []
        for _ in range(count):
            block = self.free_block_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def _evict(self, block: KVCacheBlock) -> None:
        """Forget ``block``'s hash; when it was the hash's last GPU copy, offload it first."""
        block_hash = block.block_hash
        if self.uncache(block) and self.offload is not None and block_hash not in self.cached_block_hash_to_block:
            self.offload.offload(block_hash, block.block_id)  # copied out before this step writes the block

    def uncache(self, block: KVCacheBlock) -> bool:
        """Take ``block`` out of the prefix cache (other copies of its hash stay); False if it was not
        cached. Also for a block whose KV was never written: nothing is offloaded."""
        if block.block_hash is None:
            return False
        copies = self.cached_block_hash_to_block[block.block_hash]
        del copies[block.block_id]
        if not copies:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        return True

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on cache hits; a hit on a free block pulls it out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Record that ``block`` now holds the full block named by ``block_hash``."""
        if not self.enable_caching or block.block_hash is not None:
            return  # a prefix hit: already cached under this hash
        block.block_hash = block_hash
        self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def free_blocks(self, ordered_blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order. Blocks reaching 0 that hold a
        cached hash join the free queue's tail in that order (so pass a request's blocks tail-first:
        its last blocks are evicted first); those without a hash join its head, for reuse first."""
        unhashed = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"Block {block.block_id} freed more often than it was taken.")
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    unhashed.append(block)
                else:
                    self.free_block_queue.append(block)
        self.free_block_queue.prepend_n(unhashed)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (vLLM's ``reset_prefix_cache``); refused (False) while any
        block is in use, since a running request's blocks must keep theirs."""
        if self.num_free_blocks != self.num_blocks:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.free_block_queue.created:  # a block never handed out holds no hash
            block.block_hash = None
        return True

    def usage(self) -> float:
        """Share of blocks that some request references."""
        return 1 - self.num_free_blocks / self.num_blocks
