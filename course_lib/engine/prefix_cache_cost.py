"""What prefix caching costs when nothing hits: the same prompts served with the cache on and off.

Two engines (caching on, caching off) are built once and warmed up, then serve the same unique
prompts ``pairs`` times each, interleaved in one process (on-off, then off-on, ...) so the machine's
noise hits both alike; before every run the cache is emptied (``reset_prefix_cache``), so the
caching engine looks up and registers every block and never hits. Each run is timed in CPU
seconds of the serving thread, with one PyTorch thread (restored afterwards): on a shared machine
that counts the work done rather than the time spent waiting for a core, which is what made
wall-clock runs of a fraction of a second swing by tens of percent. The result is the ratio of
each pair (on / off) with its median and quartiles: the quartiles say how far noise alone moves
one pair, so they bound what the median can show.

Beside it, the SHA-256 block hashing of the same prompts is timed alone: vLLM hashes blocks only
when caching is on, while this engine always does (so the pairs leave it out).
"""

from __future__ import annotations

import random
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from course_lib.engine.block_hash import hash_request_blocks
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

BLOCK_SIZE = 16


@dataclass(frozen=True)
class CacheCost:
    """CPU seconds per run (in run order) with caching on and off, the prompt tokens the caching
    engine looked up and found over all timed runs, and the seconds one hashing of every prompt took."""

    on_s: list[float]
    off_s: list[float]
    queried_tokens: int
    hit_tokens: int
    hashing_s: float

    @property
    def ratios(self) -> list[float]:
        """On / off for each interleaved pair."""
        return [on / off for on, off in zip(self.on_s, self.off_s)]

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The ratios' first and third quartiles: half the pairs fall between them."""
        first, _, third = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return first, third

    @property
    def hashing_share(self) -> float:
        """Hashing every prompt once, as a share of a median run with caching off."""
        return self.hashing_s / statistics.median(self.off_s)


def unique_prompts(count: int = 12, length: int = 192, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` random printable bytes: no two share even their first block."""
    rng = random.Random(seed)
    return [[rng.randrange(32, 127) for _ in range(length)] for _ in range(count)]


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` PyTorch threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_cache_cost(prompts: list[list[int]], pairs: int = 10, max_tokens: int = 4,
                       on_run: Callable[[int], None] | None = None) -> CacheCost:
    """Serve ``prompts`` ``pairs`` times with caching on and off, interleaved (module docstring);
    ``on_run(i)`` is called after the i-th timed run (0 .. 2 * pairs - 1), e.g. to move a progress bar."""
    if pairs < 2:
        raise ValueError(f"pairs={pairs}: need at least 2 pairs for quartiles; 10 is the lesson's choice.")
    longest = max(map(len, prompts)) + max_tokens + 1
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with torch_threads(1):
        engines = {caching: LLM("tiny-llama", block_size=BLOCK_SIZE, max_model_len=longest,
                                num_gpu_blocks=len(prompts) * -(-longest // BLOCK_SIZE), max_num_seqs=len(prompts),
                                max_num_batched_tokens=len(prompts) * longest, enable_prefix_caching=caching)
                   for caching in (True, False)}
        for engine in engines.values():  # first passes pay one-time costs
            engine.generate(prompts, params, use_tqdm=False)
        stats = engines[True].kv_cache_manager.prefix_cache_stats
        queried, hits = stats.queried_tokens, stats.hit_tokens
        seconds: dict[bool, list[float]] = {True: [], False: []}
        for pair in range(pairs):
            for caching in (True, False) if pair % 2 == 0 else (False, True):
                engine = engines[caching]
                engine.reset_prefix_cache()
                started = time.thread_time()
                engine.generate(prompts, params, use_tqdm=False)
                seconds[caching].append(time.thread_time() - started)
                if on_run:
                    on_run(2 * pair + (caching != (pair % 2 == 0)))
        started = time.thread_time()
        for prompt in prompts:  # as each request hashes its prompt's full blocks
            hash_request_blocks(prompt, BLOCK_SIZE)
        hashing = time.thread_time() - started
    return CacheCost(seconds[True], seconds[False], stats.queried_tokens - queried, stats.hit_tokens - hits, hashing)
