"""Per-request KV blocks on top of the block pool: prefix-cache lookup, allocation, freeing.

Rules (vLLM V1):
  * a prefix hit covers whole blocks only, walks the hash chain and stops at the first miss,
    and never covers the last prompt token (it must be computed to produce logits);
  * ``allocate_slots`` answers None when the blocks do not fit, never raises: the scheduler
    then preempts or waits. Cache hits on free blocks do not count as free capacity;
  * blocks are freed tail-first, so a request's last blocks are evicted before its first;
  * slots for speculative drafts are allocated like any token's, but a block is cached only
    once verified tokens fill it (``request.block_hashes`` never covers drafts), and
    ``rollback`` returns the blocks that only rejected drafts used;
  * with ``num_offload_blocks`` (``engine/kv_offload.py``), a GPU miss on the hash chain asks the
    CPU offload tier next and the chain goes on through either tier. ``allocate_slots`` gives
    each CPU hit a fresh GPU block, queues its reload and caches it on the GPU; when it answers
    None nothing was pinned, queued or allocated. ``take_transfers`` hands the step's copies over.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.engine.block_pool import BlockPool, KVCacheBlock
from course_lib.engine.kv_offload import KVOffloadPool, OffloadedBlock
from course_lib.engine.request import Request


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups counted in tokens (what vLLM reports as its hit rate); ``hit_tokens``
    is ``gpu_hit_tokens`` (the GPU prefix cache, counted at every lookup, as vLLM does, so a request
    that waits is counted again) plus ``cpu_hit_tokens`` (reloaded from the offload tier, counted
    once per reload, when ``allocate_slots`` queues it). As in vLLM, the lookups of a request that
    was preempted go to the ``preempted_*`` counts instead (its own earlier blocks would flatter the
    hit rate). Counters only grow: ``reset_prefix_cache`` leaves them alone."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    preempted_queried_tokens: int = 0
    preempted_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 num_offload_blocks: int = 0) -> None:
        if num_offload_blocks and not enable_caching:
            raise ValueError("The KV offload tier keeps evicted prefix-cache blocks: it needs "
                             "enable_prefix_caching=True (or drop kv_offload_blocks).")
        self.block_size = block_size
        self.offload = KVOffloadPool(num_offload_blocks) if num_offload_blocks else None
        self.block_pool = BlockPool(num_blocks, enable_caching, self.offload)
        self.enable_caching = enable_caching
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock | OffloadedBlock], int]:
        """Cached blocks that hold a prefix of ``request``, and how many tokens they cover: GPU blocks,
        and ``OffloadedBlock`` entries for the blocks only the CPU offload tier holds."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size  # leave the last token to compute
        hits: list[KVCacheBlock | OffloadedBlock] = []
        on_cpu = 0
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None and self.offload is not None and self.offload.lookup(block_hash) is not None:
                block, on_cpu = OffloadedBlock(block_hash), on_cpu + 1
            if block is None:
                break
            hits.append(block)
        # CPU-tier hits are counted once reloaded (allocate_slots), not here
        self._count(request, request.num_tokens, gpu_hit_tokens=(len(hits) - on_cpu) * self.block_size)
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock | OffloadedBlock] | None = None,
                       ) -> list[KVCacheBlock] | None:
        """Give ``request`` room for ``num_new_tokens`` more tokens (after any cache hits), or None."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        if not new_computed_blocks:
            total = request.num_computed_tokens + num_new_tokens
            if total <= len(blocks) * self.block_size:  # the common decode step: the token fits in the last block
                if total // self.block_size > request.num_computed_tokens // self.block_size:  # ...and fills it
                    self._cache_full_blocks(request, blocks, total)
                return []
        hits = new_computed_blocks or []
        on_gpu = [block for block in hits if isinstance(block, KVCacheBlock)]
        on_cpu = [hit.block_hash for hit in hits if isinstance(hit, OffloadedBlock)]
        computed = request.num_computed_tokens + len(hits) * self.block_size
        needed = -(-(computed + num_new_tokens) // self.block_size) - len(blocks) - len(hits)
        hits_now_free = sum(block.ref_cnt == 0 for block in on_gpu)
        if max(0, needed) + len(on_cpu) > self.block_pool.num_free_blocks - hits_now_free:
            return None
        self.block_pool.touch(on_gpu)  # out of the free queue: the pops below cannot evict them
        if on_cpu:
            blocks += self._reload(hits, on_cpu)
            self._count(request, 0, cpu_hit_tokens=len(on_cpu) * self.block_size)
        else:
            blocks += hits
        new_blocks = self.block_pool.get_new_blocks(max(0, needed))
        blocks += new_blocks
        self._cache_full_blocks(request, blocks, computed + num_new_tokens)
        return new_blocks

    def _count(self, request: Request, queried_tokens: int, gpu_hit_tokens: int = 0, cpu_hit_tokens: int = 0) -> None:
        """Add to ``prefix_cache_stats``: the ``preempted_*`` counts for a request that was preempted
        (as vLLM), the main ones otherwise."""
        stats = self.prefix_cache_stats
        if request.num_preemptions:
            stats.preempted_queried_tokens += queried_tokens
            stats.preempted_hit_tokens += gpu_hit_tokens + cpu_hit_tokens
        else:
            stats.queried_tokens += queried_tokens
            stats.gpu_hit_tokens += gpu_hit_tokens
            stats.cpu_hit_tokens += cpu_hit_tokens
            stats.hit_tokens += gpu_hit_tokens + cpu_hit_tokens

    def _reload(self, hits: list[KVCacheBlock | OffloadedBlock], on_cpu: list) -> list[KVCacheBlock]:
        """``hits`` as GPU blocks: a fresh one per CPU hit, its reload queued. The CPU blocks are
        pinned first, so the evictions these pops cause cannot offload over them."""
        cpu_ids = [self.offload.pin(block_hash) for block_hash in on_cpu]
        fresh = self.block_pool.get_new_blocks(len(on_cpu))
        for cpu, block in zip(cpu_ids, fresh):
            self.offload.reload(cpu, block.block_id)
        targets = iter(fresh)
        return [hit if isinstance(hit, KVCacheBlock) else next(targets) for hit in hits]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash on the GPU and in the offload tier (the counters keep counting);
        False (nothing changed) while any request holds blocks."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.offload is not None:
            self.offload.clear()
        return True

    def forget_transfers(self, offloads: list[tuple[int, int]], reloads: list[tuple[int, int]]) -> None:
        """A step failed, perhaps before the runner made its copies: the CPU blocks it offloaded to
        and the GPU blocks it reloaded into may hold garbage, so neither serves a later prefix hit.
        Call after its requests were freed (nothing else can hold a block reloaded in that step)."""
        if self.offload is None:
            return
        self.offload.forget(cpu for _, cpu in offloads)
        hash_of = {cpu: block_hash for block_hash, cpu in self.offload.cached.items()}
        for cpu, gpu in reloads:
            block = self.block_pool.cached_block_hash_to_block.get(hash_of.get(cpu), {}).get(gpu)
            if block is not None:
                self.block_pool.uncache(block)

    def take_transfers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The step's offload copies (GPU block, CPU block) and reloads (CPU block, GPU block)."""
        return self.offload.take_transfers() if self.offload is not None else ([], [])

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        start = self.num_cached_blocks.get(request.request_id, 0)
        end = min(num_tokens // self.block_size, len(request.block_hashes))
        if end <= start:
            return
        for index in range(start, end):
            self.block_pool.cache_full_block(blocks[index], request.block_hashes[index])
        self.num_cached_blocks[request.request_id] = max(start, end)

    def rollback(self, request: Request) -> None:
        """After verifying drafts: free the blocks past ``request.num_computed_tokens`` (they held
        rejected drafts only, never a hash) tail-first, and cache the blocks that verified tokens
        have just filled."""
        blocks = self.req_to_blocks[request.request_id]
        keep = -(-request.num_computed_tokens // self.block_size)
        if len(blocks) > keep:
            self.block_pool.free_blocks(list(reversed(blocks[keep:])))
            del blocks[keep:]
        self._cache_full_blocks(request, blocks, request.num_computed_tokens)

    def free(self, request: Request) -> None:
        """Release every block of ``request``, last block first. Blocks past ``num_computed_tokens``
        were allocated for tokens no forward pass has written (a request preempted after it was
        scheduled in this step): they leave the prefix cache first, so nobody can hit their garbage.
        (vLLM registers hashes at allocation too and has this hole open: PR #43569.)"""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        for block in blocks[request.num_computed_tokens // self.block_size:]:  # never shared: only this
            self.block_pool.uncache(block)  # request's allocation registered them, in this very step
        self.block_pool.free_blocks(list(reversed(blocks)))

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]
