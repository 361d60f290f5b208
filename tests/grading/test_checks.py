"""Every task's cases against solutions written in other styles (they must pass) and against the
mistakes each stated rule is there to catch (each must fail on the case built for that rule)."""

import textwrap

import nbformat
import pytest

from course_lib.exercise_files import solution_file
from course_lib.grading.checks import MODULES
from course_lib.grading.selfcheck import Checker
from course_lib.paths import REPO_ROOT


def namespace(exercise: str, replacements: dict[str, str] = {}) -> dict:
    """The solution notebook's set-up and student cells run in one namespace, with some functions
    redefined by ``replacements`` (function name -> source)."""
    book = nbformat.read(REPO_ROOT / "solutions" / solution_file(exercise), as_version=4)
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


def function_name(source: str) -> str:
    return source.split("def ", 1)[1].split("(", 1)[0]


def caught_mistake(exercise: str, source: str, case: str):
    """Grade ``source`` (a wrong version of a task's function): it must fail, and some failing case must
    name ``case`` in its rule or its call. Returns the verdict and those failing cases."""
    result = verdict(exercise, function_name(source), source)
    assert not result.passed
    caught = [c for c in result.failures if case in c.why or case in c.call]
    assert caught, f"no failing case mentions {case!r}:\n" + "\n".join(result.report(10))
    return result, caught


@pytest.mark.parametrize("exercise", MODULES)
def test_the_solution_passes_every_task(exercise):
    check = Checker(exercise)
    names = namespace(exercise)
    for function in check.tasks:
        result = check.verdict(names[function])
        assert result.passed, "\n".join(result.report())
        assert any(case.why for case in result.cases), f"{function}: every task has hand-built cases"


# (exercise, a correct solution in another style); those of modules 01-03, 05 and 06 each failed
# under the old text-comparing checks
ALTERNATIVES = [
    ("01_paging", """
        def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
            print("debugging", num_layers)
            import warnings; warnings.warn("mine")
            return 2.0 * num_layers * num_kv_heads * head_dim * dtype_bytes
    """),
    ("01_paging", """
        def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
            left = gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes
            return max(0.0, left // block_bytes)
    """),
    ("01_paging", """
        def paged_waste_fraction(lengths, block_size):
            from fractions import Fraction
            held = sum(-(-n // block_size) * block_size for n in lengths)
            return Fraction(held - sum(lengths), held)
    """),
    ("01_paging", """
        def blocks_after_parallel_sampling(prompt_len, num_samples, output_len, block_size):
            import numpy as np
            shared = prompt_len // block_size
            return shared + num_samples * (np.ceil((prompt_len + output_len) / block_size) - shared)
    """),
    ("02_batching", """
        def continuous_steps(output_lens, num_slots):
            import heapq
            free_at = [0.0] * num_slots
            for n in output_lens:
                heapq.heappush(free_at, heapq.heappop(free_at) + n)
            return max(free_at)
    """),
    ("03_scheduler", """
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
    """),
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            from collections import OrderedDict
            from course_lib.perf.kv import model_kv_bytes_per_token
            import numpy as np
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            flops = moved = np.float64(0)
            for cached, new in requests:
                pairs = sum(cached + i + 1 for i in range(new))
                flops += 2 * model.active_params * new + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
                moved += model_kv_bytes_per_token(model, "bf16") * (cached + 2 * new)
            moved += model.num_params * 2
            compute_s, memory_s = flops / gpu.bf16_flops, moved / gpu.hbm_bandwidth
            return OrderedDict(bound="compute" if compute_s >= memory_s else "memory", intensity=flops / moved,
                               bytes=int(moved), flops=flops)
    """),
    ("04_roofline", """
        def verify_greedy(draft_token_ids, target_argmax_ids):
            from itertools import takewhile
            accepted = len(list(takewhile(lambda pair: pair[0] == pair[1], zip(draft_token_ids, target_argmax_ids))))
            return torch.tensor(target_argmax_ids[:accepted + 1])
    """),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            # a uniform draw for each decision, and the inverse CDF of the residual instead of multinomial
            p, q, x = target_probs.tolist(), draft_probs.tolist(), draft_token
            u, v = torch.rand(2, generator=generator, dtype=torch.float64).tolist()
            if u * q[x] < p[x]:
                return x
            cumulative = torch.tensor([max(0.0, a - b) for a, b in zip(p, q)]).cumsum(0)
            return torch.searchsorted(cumulative, v * cumulative[-1], right=True)
    """),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            import numpy as np
            accept = torch.clamp(target_probs[draft_token] / draft_probs[draft_token], max=1.0)
            if torch.bernoulli(accept, generator=generator):
                return np.int64(draft_token)
            residual = (target_probs - draft_probs).clamp(min=0)
            return torch.multinomial(residual.float(), 1, generator=generator)
    """),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            # the engine's own sampler, one draft: the exact shares the check expects come from this rule
            from course_lib.engine.rejection_sampler import rejection_sample
            from course_lib.engine.sampling_params import SamplingParams
            logits = target_probs.log().expand(2, -1)  # a bonus row too; log(0) = -inf keeps p(y) = 0
            tokens, _ = rejection_sample(logits, [draft_token], draft_probs[None], SamplingParams(), generator)
            return tokens[0]
    """),
    ("04_roofline", """
        def prefill_per_decode(num_seqs, tpot_s, output_len, prefill_requests_per_s):
            from fractions import Fraction
            tokens = Fraction(num_seqs) / Fraction(tpot_s)
            return {"prefill_per_decode": num_seqs / (tpot_s * output_len * prefill_requests_per_s),
                    "decode_requests_per_s": tokens / output_len, "decode_tokens_per_s": tokens}
    """),
    ("05_collectives", """
        def all_reduce_via_shards(tensor):
            shard = torch.empty(tensor.numel() // dist.get_world_size())
            dist.reduce_scatter_tensor(shard, tensor)   # the older names: FutureWarning from torch 2.13 on
            dist.all_gather_into_tensor(tensor, shard)
            print("rank", dist.get_rank(), "done")
    """),
    ("06_ring_vs_tree", """
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
    """),
]


@pytest.mark.parametrize("exercise, source", ALTERNATIVES, ids=lambda v: v if len(str(v)) < 40 else None)
def test_correct_solutions_in_other_styles_pass(exercise, source):
    result = verdict(exercise, function_name(source), source)
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
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            flops = 2 * model.active_params * sum(new for _, new in requests)
            kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            moved = 2 * model.num_params + kv * sum(cached + 2 * new for cached, new in requests)
            bound = "compute" if flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth else "memory"
            return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": bound}
     """, "every new token attends them all", "add attention's FLOPs"),
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            pairs = sum(new * cached for cached, new in requests)
            flops = 2 * model.active_params * sum(new for _, new in requests) + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
            kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            moved = 2 * model.num_params + kv * sum(cached + 2 * new for cached, new in requests)
            bound = "compute" if flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth else "memory"
            return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": bound}
     """, "every new token attends them all", "new token i (from 0) attends"),
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            pairs = sum(new * cached + new * (new + 1) // 2 for cached, new in requests)
            flops = 2 * model.num_params * sum(new for _, new in requests) + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
            kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            moved = 2 * model.num_params + kv * sum(cached + 2 * new for cached, new in requests)
            bound = "compute" if flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth else "memory"
            return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": bound}
     """, "a mixture of experts", "ACTIVE parameters"),
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            pairs = sum(new * cached + new * (new + 1) // 2 for cached, new in requests)
            flops = 2 * model.active_params * sum(new for _, new in requests) + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
            kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            moved = 2 * model.active_params + kv * sum(cached + 2 * new for cached, new in requests)
            bound = "compute" if flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth else "memory"
            return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": bound}
     """, "a mixture of experts", "ALL parameters"),
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            pairs = sum(new * cached + new * (new + 1) // 2 for cached, new in requests)
            flops = 2 * model.active_params * sum(new for _, new in requests) + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
            kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            moved = 2 * model.num_params + kv * sum(cached for cached, new in requests)   # only the cached KV
            bound = "compute" if flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth else "memory"
            return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": bound}
     """, "each reads its own KV", "read for every context token (cached + new)"),
    ("04_roofline", """
        def step_intensity(model_name, gpu_name, requests):
            model = get_model(model_name)
            pairs = sum(new * cached + new * (new + 1) // 2 for cached, new in requests)
            flops = 2 * model.active_params * sum(new for _, new in requests) + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
            kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            moved = 2 * model.num_params + kv * sum(cached + 2 * new for cached, new in requests)
            bound = "compute" if flops / moved >= 295 else "memory"   # the H100's ridge point for every GPU
            return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": bound}
     """, "A100, compute-bound", "ridge point, bf16_flops / hbm_bandwidth"),
    ("04_roofline", """
        def verify_greedy(draft_token_ids, target_argmax_ids):
            emitted = []
            for draft, target in zip(draft_token_ids, target_argmax_ids):
                if draft != target:
                    return emitted + [target]
                emitted.append(draft)
            return emitted
     """, "plus the bonus token", "the bonus"),
    ("04_roofline", """
        def verify_greedy(draft_token_ids, target_argmax_ids):
            emitted = [target if draft != target else draft for draft, target in zip(draft_token_ids, target_argmax_ids)]
            return emitted + [target_argmax_ids[-1]]
     """, "does not count", "stop at the first mismatch"),
    ("04_roofline", """
        def verify_greedy(draft_token_ids, target_argmax_ids):
            emitted = []
            for draft, target in zip(draft_token_ids, target_argmax_ids):
                emitted.append(draft)
                if draft != target:
                    return emitted
            return emitted + [target_argmax_ids[-1]]
     """, "the target's token replaces it", "not the rejected draft"),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            return draft_token
     """, "p(x) < q(x)", "accepted with probability min(1, p(x) / q(x))"),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            p, q, x = target_probs, draft_probs, draft_token
            if float(torch.rand(1, generator=generator)) < min(1.0, float(p[x] / q[x])):
                return x
            return int(torch.multinomial(p, 1, generator=generator))   # p itself, not the residual
     """, "never emitted", "sample max(0, p - q) normalised"),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            p, q, x = target_probs, draft_probs, draft_token
            if float(torch.rand(1, generator=generator)) < float(p[x]):   # q left out
                return x
            residual = torch.clamp(p - q, min=0)
            if residual.sum() == 0:
                return int(torch.multinomial(p, 1, generator=generator))
            return int(torch.multinomial(residual, 1, generator=generator))
     """, "p(x) < q(x)", "min(1, p(x) / q(x))"),
    ("04_roofline", """
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            p, q, x = target_probs, draft_probs, draft_token
            if float(torch.rand(1, generator=generator)) * p[x] < q[x]:   # q/p, upside down
                return x
            residual = torch.clamp(p - q, min=0)
            return int(torch.multinomial(residual, 1, generator=generator))
     """, "p(x) >= q(x): always accepted", "always accepted"),
    ("04_roofline", """
        def prefill_per_decode(num_seqs, tpot_s, output_len, prefill_requests_per_s):
            tokens = num_seqs / tpot_s
            return {"decode_tokens_per_s": tokens, "decode_requests_per_s": tokens,
                    "prefill_per_decode": tokens / prefill_requests_per_s}
     """, "1.28", "divide the tokens per second by output_len"),
    ("04_roofline", """
        def prefill_per_decode(num_seqs, tpot_s, output_len, prefill_requests_per_s):
            requests = num_seqs / tpot_s / output_len
            return {"decode_tokens_per_s": num_seqs / tpot_s, "decode_requests_per_s": requests,
                    "prefill_per_decode": prefill_requests_per_s / requests}
     """, "1.28", "upside down"),
    ("04_roofline", """
        def prefill_per_decode(num_seqs, tpot_s, output_len, prefill_requests_per_s):
            tokens = num_seqs * tpot_s
            return {"decode_tokens_per_s": tokens, "decode_requests_per_s": tokens / output_len,
                    "prefill_per_decode": tokens / output_len / prefill_requests_per_s}
     """, "1.28", "num_seqs / tpot_s"),
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
    result, _ = caught_mistake(exercise, source, case)
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


def test_every_sampled_case_expects_enough_draws_of_each_possible_token():
    """The chi-square test holds when every possible token is expected about 5 times or more."""
    task = Checker("04_roofline").tasks["rejection_step"]
    for case in task.cases():
        shares = task.reference(*case.args, **case.kwargs)
        assert sum(shares) == pytest.approx(1.0)
        assert all(share == 0 or share * case.kwargs["draws"] >= 5 for share in shares), case


@pytest.mark.parametrize("returned, message", [
    ("2.0", "call 1 returned 2.0 (float); return a token id, an int"),
    ("True", "call 1 returned True (bool); return a token id, an int"),
    ("-1", "call 1 returned token -1, outside the vocabulary (0 to 4)"),
])
def test_a_sampler_that_returns_no_token_of_the_vocabulary_is_told_so(returned, message):
    result = verdict("04_roofline", "rejection_step", f"""
        def rejection_step(target_probs, draft_probs, draft_token, generator):
            return {returned}
    """)
    assert not result.passed and message in result.failures[0].got, "\n".join(result.report(1))
    assert result.failures[0].expected == "shares [0.25, 0.25, 0.125, 0.25, 0.125]"
