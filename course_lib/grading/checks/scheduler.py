"""Exercise 03's tasks: the prefix cache's hash chain, the longest cached prefix, one step under a token budget.

Every expected value comes from the course engine: ``hash_request_blocks``, the KV cache
manager's lookup over a real block pool, and the scheduler's own ``schedule()`` on a state
built to order.
"""

from __future__ import annotations

import random

from course_lib.engine.block_hash import hash_request_blocks
from course_lib.engine.config import SchedulerConfig
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.request import Request, RequestStatus
from course_lib.engine.sampling_params import SamplingParams
from course_lib.engine.scheduler import Scheduler
from course_lib.grading.task import Case, Task
from course_lib.grading.values import Rule

CONTEXT_BLOCK = 4  # block size of the states built for Task 3


def make_request(request_id: str, prompt: list[int], block_size: int, output_len: int = 8,
                 cache_salt: str | None = None) -> Request:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    return Request(request_id, list(prompt), params, None, 0.0, block_size, 4096, cache_salt)


# Task 1

def _chain_cases() -> list[Case]:
    cases = [Case(([], 4), why="no tokens: no blocks"),
             Case(([5, 6, 7], 4), why="a partial block gets no hash"),
             Case((list(range(11)), 4), why="two full blocks and a partial one"),
             Case((list(range(12)), 4, "tenant-a"), why="the salt goes into block 0 only"),
             Case((list(range(8)), 4, None), why="no salt: block 0's extra keys are None")]
    rng = random.Random(3)
    for _ in range(40):
        size = rng.randint(1, 8)
        tokens = [rng.randrange(0, 50) for _ in range(rng.randint(0, 40))]
        cases.append(Case((tokens, size, rng.choice([None, "tenant-a", "tenant-b"]))))
    return cases


def _chain_hint(case: Case, expected, got) -> str | None:
    if len(got) != len(expected):
        return f"one hash per FULL block: {len(expected)} here; a trailing partial block gets none"
    if got and got[0] == expected[0]:
        return "block 0 is right; each later block's parent is the previous block's hash, and its extra keys are None"
    if len(case.args) > 2 and case.args[2] is not None:
        return "block 0 carries the salt as the extra keys tuple (cache_salt,)"
    return "block 0 has no parent (None) and, without a salt, no extra keys (None)"


# Task 2

def engine_cached_prefix_tokens(block_hashes: list[bytes], cached: set[bytes], num_prompt_tokens: int,
                                block_size: int) -> int:
    """Prompt tokens the KV cache manager serves from a pool holding exactly the blocks in ``cached``."""
    manager = KVCacheManager(len(cached) + 1, block_size)
    pool = manager.block_pool
    blocks = pool.get_new_blocks(len(cached))
    for block, block_hash in zip(blocks, sorted(cached)):
        pool.cache_full_block(block, block_hash)
    pool.free_blocks(blocks)  # free but still cached: a hit revives them
    request = make_request("query", [0] * num_prompt_tokens, block_size)
    request.block_hashes = list(block_hashes)
    return manager.get_computed_blocks(request)[1]


def _lookup_cases() -> list[Case]:
    prompt = list(range(12))  # three blocks of 4
    hashes = hash_request_blocks(prompt, 4)
    longer = hash_request_blocks(prompt + [99, 98], 4)  # 14 tokens: three full blocks and a partial
    cases = [Case((hashes, set(hashes), 12, 4), why="every block cached, but the prompt's last token must be computed"),
             Case((longer, {longer[0], longer[2]}, 14, 4), why="a miss at block 1 stops the lookup, though block 2 is cached"),
             Case((longer, {longer[1], longer[2]}, 14, 4), why="a miss at block 0: nothing is served"),
             Case((longer, set(longer), 14, 4), why="a partial last block: every full block can hit"),
             Case((longer, set(longer), 13, 4),
                  why="13 tokens: the last one alone after 3 full blocks, (13 - 1) // 4 = 3, so all 3 can hit")]
    rng = random.Random(4)
    for trial in range(40):
        size = rng.randint(1, 6)
        manager = KVCacheManager(2048, size)
        shared = [rng.randrange(0, 5) for _ in range(rng.randint(0, 30))]
        for i in range(rng.randint(1, 4)):  # earlier requests fill the cache
            earlier = make_request(f"old{i}", shared[:rng.randint(0, len(shared))]
                                   + [rng.randrange(0, 5) for _ in range(rng.randint(1, 20))], size)
            manager.allocate_slots(earlier, earlier.num_tokens)
        query = make_request("new", shared + [rng.randrange(0, 5) for _ in range(rng.randint(1, 20))], size)
        cases.append(Case((query.block_hashes, set(manager.block_pool.cached_block_hash_to_block), query.num_tokens, size)))
    return cases


def _lookup_hint(case: Case, expected, got) -> str | None:
    block_hashes, cached, num_tokens, size = case.args
    if got % size:
        return "a whole number of blocks, in tokens: a multiple of block_size"
    if got > expected and got // size > (num_tokens - 1) // size:
        return "the hits may never cover the prompt's last token: at most (num_prompt_tokens - 1) // block_size blocks"
    if got > expected:
        return "stop at the first miss: a block after a miss cannot be used"
    if got < expected:
        return (f"too few: every leading cached block counts, up to (num_prompt_tokens - 1) // block_size = "
                f"{(num_tokens - 1) // size} blocks (a block that ends before the prompt's last token can hit)")
    return None


# Task 3

def engine_plan(running: list, waiting: list, budget: int, max_num_seqs: int, long_prefill_token_threshold: int = 0) -> dict:
    """The step the course scheduler plans for this state: running requests that have computed one
    block of context each, waiting ones that have computed nothing; a KV cache that never runs out."""
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=1 << 20,
                             long_prefill_token_threshold=long_prefill_token_threshold)
    scheduler = Scheduler(config, KVCacheManager(8192, CONTEXT_BLOCK, enable_caching=False))
    for request_id, tokens_left in running:
        request = make_request(request_id, [1] * (CONTEXT_BLOCK + tokens_left), CONTEXT_BLOCK)
        scheduler.requests[request_id] = request
        scheduler.kv.allocate_slots(request, CONTEXT_BLOCK)
        request.num_computed_tokens = CONTEXT_BLOCK
        request.status = RequestStatus.RUNNING
        scheduler.running.append(request)
    for request_id, tokens_left in waiting:
        scheduler.add_request(make_request(request_id, [1] * tokens_left, CONTEXT_BLOCK))
    return scheduler.schedule().num_scheduled_tokens


def random_state(seed: int) -> dict:
    """A random scheduler state a few real steps into a run: the running and waiting queues as
    (request id, tokens left) and the limits."""
    rng = random.Random(seed)
    config = SchedulerConfig(max_num_seqs=rng.randint(1, 6), max_num_batched_tokens=rng.randint(4, 64),
                             max_model_len=4096, long_prefill_token_threshold=rng.choice([0, 0, 5, 16]))
    scheduler = Scheduler(config, KVCacheManager(4096, 4, enable_caching=False))
    count = 0

    def add_some(k: int) -> None:
        nonlocal count
        for _ in range(k):
            prompt = [rng.randrange(1, 100) for _ in range(rng.randint(1, 80))]
            scheduler.add_request(make_request(f"r{count}", prompt, 4, output_len=rng.randint(1, 30)))
            count += 1

    add_some(rng.randint(1, 8))
    for _ in range(rng.randint(0, 6)):
        plan = scheduler.schedule()
        sampled = {rid: 7 for rid, n in plan.num_scheduled_tokens.items()
                   if scheduler.requests[rid].num_computed_tokens + n == scheduler.requests[rid].num_tokens}
        scheduler.update_from_output(plan, sampled, 0.0)
        add_some(rng.randint(0, 2))
    return dict(running=[(r.request_id, r.num_tokens - r.num_computed_tokens) for r in scheduler.running],
                waiting=[(r.request_id, r.num_tokens - r.num_computed_tokens) for r in scheduler.waiting],
                budget=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
                long_prefill_token_threshold=config.long_prefill_token_threshold)


def _step_case(running, waiting, budget, max_num_seqs, threshold=0, why="") -> Case:
    return Case((), dict(running=running, waiting=waiting, budget=budget, max_num_seqs=max_num_seqs,
                         long_prefill_token_threshold=threshold), why=why)


def _step_cases() -> list[Case]:
    return [_step_case([("chat", 1), ("doc", 15000)], [("new", 300)], 512, 8, 256,
                       why="a decode, a long prefill capped at 256, and a new request taking the rest"),
            _step_case([("a", 1), ("b", 1)], [("c", 10)], 2, 8,
                       why="the running requests spend the whole budget: nobody else gets an entry"),
            _step_case([("a", 1)], [("b", 5), ("c", 5)], 100, 2,
                       why="max_num_seqs counts the running requests too"),
            _step_case([("doc", 15000)], [], 512, 8, 256, why="the threshold caps running requests too"),
            _step_case([("doc", 15000)], [], 512, 8, 0, why="a threshold of 0 means no cap"),
            _step_case([], [("x", 3), ("y", 40), ("z", 2)], 20, 8,
                       why="the budget runs out partway through a prompt"),
            _step_case([], [("x", 3), ("y", 17), ("z", 2)], 20, 8,
                       why="the budget is spent exactly at the end of a prompt: nobody after it gets an entry"),
            _step_case([("doc", 15000), ("chat", 1)], [("new", 300)], 512, 8, 256,
                       why="a capped prefill does not end the running requests' turn: the decode after it still runs"),
            _step_case([("doc", 600), ("chat", 1)], [("new", 5)], 512, 8,
                       why="queue order: the budget runs out on the long running request, and the decode after it "
                           "waits; serving the shortest first would starve the long one"),
            _step_case([("a", 1), ("b", 1), ("c", 1)], [("w", 5)], 100, 2,
                       why="max_num_seqs only stops admissions: 3 running requests all run with max_num_seqs=2, "
                           "none is starved"),
            _step_case([("a", 1), ("b", 1)], [("w", 5)], 100, 2,
                       why="running requests already fill max_num_seqs: budget is left, but no admission"),
            ] + [Case((), random_state(seed)) for seed in range(60)]


def _step_hint(case: Case, expected, got) -> str | None:
    queue = [rid for rid, _ in case.kwargs["running"]]
    starved = [rid for rid in queue if rid in expected and isinstance(got, dict) and rid not in got]
    if isinstance(got, dict) and any(
            rid in expected and got.get(rid, 0) < expected[rid] and any(r in got and r not in expected for r in later)
            for rid, later in ((rid, queue[i + 1:]) for i, rid in enumerate(queue))):
        return ("running requests in queue order: each takes what it can (up to the cap) before the next, so a "
                "long one is never starved for shorter ones behind it")
    if starved:
        return (f"running request {starved[0]!r} got nothing while budget was left: every running request gets "
                "tokens, in order, until the budget is spent; max_num_seqs limits only the waiting requests "
                "admitted, and a capped prefill does not end the running requests' turn")
    if isinstance(got, dict) and any(v == 0 for v in got.values()):
        return "a request that gets no tokens gets no entry: stop once the budget is spent"
    if isinstance(got, dict) and dict(got) == dict(expected):
        return "right tokens, wrong order: running requests first, then waiting ones, each in queue order"
    if isinstance(got, dict) and len(got) > len(expected):
        return "too many requests: check the budget and max_num_seqs (running plus admitted)"
    return None


def _describe_step(case: Case) -> str:
    k = case.kwargs
    text = (f"plan_step(running={k['running']}, waiting={k['waiting']}, budget={k['budget']}, "
            f"max_num_seqs={k['max_num_seqs']}, long_prefill_token_threshold={k['long_prefill_token_threshold']})")
    return text if len(text) <= 240 else text[:237] + "..."


TASKS = (
    Task(1, "The hash chain", "block_hash_chain", _chain_cases, hash_request_blocks, hint=_chain_hint, examples=0),
    Task(2, "The longest cached prefix", "cached_prefix_tokens", _lookup_cases, engine_cached_prefix_tokens,
         hint=_lookup_hint, describe=lambda case: (
             f"cached_prefix_tokens(<{len(case.args[0])} block hashes>, <{len(case.args[1])} cached>, "
             f"num_prompt_tokens={case.args[2]}, block_size={case.args[3]})"), examples=2),
    Task(3, "One step under a token budget", "plan_step", _step_cases, engine_plan, rule=Rule(ordered=True),
         hint=_step_hint, describe=_describe_step, examples=1),
)
