"""Every task's cases against solutions written in other styles (they must pass) and against the
mistakes each stated rule is there to catch (each must fail on the case built for that rule)."""

import textwrap

import nbformat
import pytest

from course_lib.grading.selfcheck import Checker
from course_lib.paths import REPO_ROOT


def namespace(exercise: str, replacements: dict[str, str] = {}) -> dict:
    """The solution notebook's set-up and student cells run in one namespace, with some functions
    redefined by ``replacements`` (function name -> source)."""
    book = nbformat.read(REPO_ROOT / "solutions" / f"{exercise}.ipynb", as_version=4)
    names: dict = {}
    for cell in book.cells:
        if cell.cell_type == "code" and "check" not in cell.metadata.get("tags", []):
            exec(cell.source, names)
    for source in replacements.values():
        exec(textwrap.dedent(source), names)
    return names


def verdict(exercise: str, function: str, source: str | None = None):
    names = namespace(exercise, {function: source} if source else {})
    return Checker(exercise).verdict(names[function])


@pytest.mark.parametrize("exercise", ["01_paging", "02_batching", "03_scheduler", "05_collectives", "06_ring_vs_tree"])
def test_the_solution_passes_every_task(exercise):
    check = Checker(exercise)
    names = namespace(exercise)
    for function in check.tasks:
        result = check.verdict(names[function])
        assert result.passed, "\n".join(result.report())
        assert any(case.why for case in result.cases), f"{function}: every task has hand-built cases"


ALTERNATIVES = {  # correct solutions in other styles, each failed under the old text-comparing checks
    ("01_paging", "kv_bytes_per_token"): """
        def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
            print("debugging", num_layers)
            import warnings; warnings.warn("mine")
            return 2.0 * num_layers * num_kv_heads * head_dim * dtype_bytes
    """,
    ("01_paging", "kv_blocks_available"): """
        def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
            left = gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes
            return max(0.0, left // block_bytes)
    """,
    ("01_paging", "paged_waste_fraction"): """
        def paged_waste_fraction(lengths, block_size):
            from fractions import Fraction
            held = sum(-(-n // block_size) * block_size for n in lengths)
            return Fraction(held - sum(lengths), held)
    """,
    ("01_paging", "blocks_after_parallel_sampling"): """
        def blocks_after_parallel_sampling(prompt_len, num_samples, output_len, block_size):
            import numpy as np
            shared = prompt_len // block_size
            return shared + num_samples * (np.ceil((prompt_len + output_len) / block_size) - shared)
    """,
    ("02_batching", "continuous_steps"): """
        def continuous_steps(output_lens, num_slots):
            import heapq
            free_at = [0.0] * num_slots
            for n in output_lens:
                heapq.heappush(free_at, heapq.heappop(free_at) + n)
            return max(free_at)
    """,
    ("03_scheduler", "plan_step"): """
        def plan_step(running, waiting, budget, max_num_seqs, long_prefill_token_threshold=0):
            from collections import OrderedDict
            plan, seqs = OrderedDict(), len(running)
            cap = long_prefill_token_threshold or float("inf")
            for queue, limited in ((running, False), (waiting, True)):
                for request_id, left in queue:
                    if budget <= 0 or (limited and seqs >= max_num_seqs):
                        return plan
                    plan[request_id] = int(min(left, cap, budget))
                    budget -= plan[request_id]
                    seqs += limited
            return plan
    """,
    ("05_collectives", "all_reduce_via_shards"): """
        def all_reduce_via_shards(tensor):
            shard = torch.empty(tensor.numel() // dist.get_world_size())
            dist.reduce_scatter_tensor(shard, tensor)   # the older names: FutureWarning from torch 2.13 on
            dist.all_gather_into_tensor(tensor, shard)
            print("rank", dist.get_rank(), "done")
    """,
    ("06_ring_vs_tree", "my_ring_all_reduce"): """
        def my_ring_all_reduce(tensor):
            rank, world = dist.get_rank(), dist.get_world_size()
            chunks = tensor.tensor_split(world)
            for phase, send, receive in ring_schedule(rank, world):
                buffer = torch.empty_like(chunks[receive])
                ops = [dist.P2POp(dist.isend, chunks[send], (rank + 1) % world),
                       dist.P2POp(dist.irecv, buffer, (rank - 1) % world)]
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
                if phase == "scatter-reduce":
                    chunks[receive].add_(buffer)
                else:
                    chunks[receive].copy_(buffer)
    """,
}


@pytest.mark.parametrize("exercise, function", list(ALTERNATIVES), ids=lambda v: str(v))
def test_correct_solutions_in_other_styles_pass(exercise, function):
    result = verdict(exercise, function, ALTERNATIVES[(exercise, function)])
    assert result.passed, "\n".join(result.report())


MISTAKES = [  # (exercise, wrong source, the hand-built case that must catch it, words the hint must contain)
    ("01_paging", """
        def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
            return num_layers * num_kv_heads * head_dim * dtype_bytes
     """, "Llama-3-8B in fp16", "AND a value"),
    ("01_paging", """
        def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
            return int((gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes) // block_bytes)
     """, "never negative", "return 0"),
    ("01_paging", """
        def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
            import math
            return max(0, math.ceil((gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes) / block_bytes))
     """, "one byte short", "round down"),
    ("01_paging", """
        def paged_waste_fraction(lengths, block_size):
            held = sum(-(-n // block_size) * block_size for n in lengths)
            return (held - sum(lengths)) / sum(lengths)
     """, "100, 17 and 16", "not by the tokens"),
    ("01_paging", """
        def blocks_after_parallel_sampling(prompt_len, num_samples, output_len, block_size):
            return num_samples * -(-(prompt_len + output_len) // block_size)
     """, "a 512-token prompt", "shared by every sample"),
    ("02_batching", """
        def static_steps(output_lens, num_slots):
            lens = sorted(output_lens)
            return sum(max(lens[i:i + num_slots]) for i in range(0, len(lens), num_slots))
     """, "arrival order, not sorted", "arrival order"),
    ("02_batching", """
        def static_idle_slot_steps(output_lens, num_slots):
            idle = 0
            for i in range(0, len(output_lens), num_slots):
                batch = output_lens[i:i + num_slots]
                idle += sum(max(batch) - n for n in batch)
            return idle
     """, "half empty", "empty slots idle"),
    ("02_batching", """
        def continuous_steps(output_lens, num_slots):
            slots = [0] * num_slots
            for i, n in enumerate(output_lens):
                slots[i % num_slots] += n
            return max(slots)
     """, "frees first", ""),
    ("03_scheduler", """
        def block_hash_chain(token_ids, block_size, cache_salt=None):
            hashes, parent = [], None
            for start in range(0, len(token_ids) - block_size + 1, block_size):
                extra = (cache_salt,) if cache_salt is not None else None
                parent = hash_block_tokens(parent, token_ids[start:start + block_size], extra)
                hashes.append(parent)
            return hashes
     """, "block 0 only", "extra keys are None"),
    ("03_scheduler", """
        def block_hash_chain(token_ids, block_size, cache_salt=None):
            hashes, parent = [], None
            for start in range(0, len(token_ids), block_size):
                extra = (cache_salt,) if start == 0 and cache_salt is not None else None
                parent = hash_block_tokens(parent, token_ids[start:start + block_size], extra)
                hashes.append(parent)
            return hashes
     """, "partial block gets no hash", "FULL block"),
    ("03_scheduler", """
        def cached_prefix_tokens(block_hashes, cached, num_prompt_tokens, block_size):
            hits = 0
            for block_hash in block_hashes:
                if block_hash not in cached:
                    break
                hits += 1
            return hits * block_size
     """, "last token must be computed", "never cover the prompt's last token"),
    ("03_scheduler", """
        def cached_prefix_tokens(block_hashes, cached, num_prompt_tokens, block_size):
            usable = block_hashes[:(num_prompt_tokens - 1) // block_size]
            return sum(h in cached for h in usable) * block_size
     """, "a miss at block 1", "first miss"),
    ("03_scheduler", """
        def plan_step(running, waiting, budget, max_num_seqs, long_prefill_token_threshold=0):
            plan = {}
            take = lambda left: min(left, long_prefill_token_threshold or left, budget)
            for request_id, left in running:
                plan[request_id] = take(left)
                budget -= plan[request_id]
            admitted = len(running)
            for request_id, left in waiting:
                if admitted >= max_num_seqs:
                    break
                plan[request_id] = take(left)
                budget -= plan[request_id]
                admitted += 1
            return plan
     """, "nobody else gets an entry", "no entry"),
    ("03_scheduler", """
        def plan_step(running, waiting, budget, max_num_seqs, long_prefill_token_threshold=0):
            plan = {}
            take = lambda left: min(left, long_prefill_token_threshold or left, budget)
            for request_id, left in running:
                if budget <= 0:
                    break
                plan[request_id] = take(left)
                budget -= plan[request_id]
            for request_id, left in waiting[:max_num_seqs]:
                if budget <= 0:
                    break
                plan[request_id] = take(left)
                budget -= plan[request_id]
            return plan
     """, "counts the running requests too", "max_num_seqs"),
    ("05_collectives", """
        def all_reduce_via_root(tensor):
            result = tensor.clone()
            dist.reduce(result, dst=0)
            dist.broadcast(result, src=0)
            return result
     """, "", "unchanged"),
    ("05_collectives", """
        def all_reduce_via_root(tensor):
            dist.reduce(tensor, dst=0)
     """, "", "rank 0 has the sum"),
    ("05_collectives", """
        def average_gradients(model):
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
     """, "2 ranks", "divide by the number of ranks"),
    ("05_collectives", """
        def average_gradients(model):
            for parameter in model.parameters():
                grad = parameter.grad.clone()
                dist.all_reduce(grad)
                grad = grad / dist.get_world_size()
     """, "2 ranks", "write the averaged gradient back"),
    ("06_ring_vs_tree", """
        def my_ring_all_reduce(tensor):
            rank, world = dist.get_rank(), dist.get_world_size()
            chunks = tensor.chunk(world)
            for phase, send, receive in ring_schedule(rank, world):
                buffer = torch.empty_like(chunks[receive]) if phase == "scatter-reduce" else chunks[receive]
                request = dist.isend(chunks[send], dst=(rank + 1) % world)
                dist.recv(buffer, src=(rank - 1) % world)
                request.wait()
                if phase == "scatter-reduce":
                    chunks[receive].add_(buffer)
     """, "tensor.chunk would give 3", ""),
    ("06_ring_vs_tree", """
        def faster_algorithm(n, num_bytes, alpha, beta):
            ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * num_bytes * beta
            tree = 2 * math.log2(n) * alpha + 4 * num_bytes * beta
            return "ring" if ring < tree else "tree"
     """, "tie", "a tie goes to the ring"),
]


@pytest.mark.parametrize("exercise, source, case, hint", MISTAKES, ids=lambda v: v if len(str(v)) < 40 else None)
def test_each_stated_rule_has_a_case_that_catches_its_mistake(exercise, source, case, hint):
    function = source.split("def ", 1)[1].split("(", 1)[0]
    result = verdict(exercise, function, source)
    assert not result.passed
    caught = [c for c in result.failures if case in c.why or case in c.call]
    assert caught, f"no failing case mentions {case!r}:\n" + "\n".join(result.report(10))
    assert any(hint in c.hint for c in result.failures), "\n".join(result.report(10))


def test_swapped_neighbours_report_the_real_error():
    result = verdict("06_ring_vs_tree", "my_ring_all_reduce", """
        def my_ring_all_reduce(tensor):
            rank, world = dist.get_rank(), dist.get_world_size()
            chunks = tensor.tensor_split(world)
            for phase, send, receive in ring_schedule(rank, world):
                buffer = torch.empty_like(chunks[receive]) if phase == "scatter-reduce" else chunks[receive]
                request = dist.isend(chunks[send], dst=(rank - 1) % world)   # neighbours swapped
                dist.recv(buffer, src=(rank + 1) % world)
                request.wait()
                if phase == "scatter-reduce":
                    chunks[receive].add_(buffer)
    """)
    assert not result.passed
    assert all("doesn't match expected size" in case.got for case in result.failures), "\n".join(result.report(5))
