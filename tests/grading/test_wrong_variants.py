"""Every stated rule of every graded task has a wrong variant, and the grader fails it (issue 30).

For each task of exercises 01-09 (enumerated from ``course_lib/grading/checks``, so a new task
without variants fails ``test_every_task_has_wrong_variants``) this file holds a correct function
with keyword-only switches, each switch breaking one rule the task states: an off-by-one at a
boundary, ``>`` for ``>=``, a missing factor, the wrong order, a limit ignored. A variant is that
function with one switch flipped (``variant``), and ``RULES`` names, per task, the rule, the
hand-built case whose ``why`` states it, and the variant that breaks it.

They are judged exactly as the graders judge a learner: ``calls.run_cases`` calls the function
on the task's cases (on real gloo ranks where the task runs on ranks) and ``task.judge`` compares
the results with the expected values by value. A variant is run on the cases whose ``why``
contains its key (the cheap path for the rank tasks) and must fail there; the correct function
must pass every case of its task. Every hand-built case's ``why`` is either the key of some
variant or listed in ``ILLUSTRATIONS`` (a data point that states no rule of its own), so a new
rule case without a variant fails ``test_every_rule_case_has_a_wrong_variant``.

A rule no case catches is a gap in the grader: its variant is marked ``xfail(strict=True)``
with the gap named, and is run on every case of the task, so that the test turns red once a case
catches it (then give it the case's key and drop the mark).
"""

from __future__ import annotations

import functools
import heapq
import math
import re
import types
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.engine.block_hash import hash_block_tokens
from course_lib.grading.calls import run_cases
from course_lib.grading.checks import MODULES, exercise_tasks
from course_lib.grading.selfcheck import plain_cases
from course_lib.grading.task import Task, TaskVerdict, expected_values, judge


def variant(fn: Callable, globals_: dict | None = None, **switches) -> Callable:
    """``fn`` with some keyword-only switches flipped (and, given ``globals_``, other globals): a
    real function of the same name, as a learner's would be."""
    copy = types.FunctionType(fn.__code__, {**fn.__globals__, **globals_} if globals_ else fn.__globals__,
                              fn.__name__, fn.__defaults__, fn.__closure__)
    unknown = set(switches) - set(fn.__kwdefaults__ or {})
    assert not unknown, f"{fn.__name__} has no switch {unknown}"
    copy.__kwdefaults__ = {**(fn.__kwdefaults__ or {}), **switches}
    copy.__qualname__ = fn.__qualname__
    return copy


# ---------------------------------------------------------------------------------------------
# 01 · paging

def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes, *, vectors=2, per_layer=True,
                       per_kv_head=True, element_bytes=None):
    return (vectors * (num_layers if per_layer else 1) * (num_kv_heads if per_kv_head else 1) * head_dim
            * (element_bytes or dtype_bytes))


def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes, *,
                        rounding="down", clamp=True, activations=True, share_of="the whole GPU"):
    if share_of == "the whole GPU":
        left = gpu_memory_utilization * gpu_memory_bytes - weight_bytes - (activation_bytes if activations else 0)
    else:  # the utilization applied to what the weights and activations leave
        left = gpu_memory_utilization * (gpu_memory_bytes - weight_bytes - activation_bytes)
    blocks = {"down": left // block_bytes, "up": math.ceil(left / block_bytes), "nearest": round(left / block_bytes),
              "strictly below": math.ceil(left / block_bytes) - 1}[rounding]
    return max(0, int(blocks)) if clamp else int(blocks)


def paged_waste_fraction(lengths, block_size, *, divide_by="held", blocks="ceil"):
    count = {"ceil": lambda n: -(-n // block_size), "floor": lambda n: n // block_size,
             "one more": lambda n: n // block_size + 1}[blocks]
    held = sum(count(n) * block_size for n in lengths)
    if divide_by == "each request's own":
        return sum((count(n) * block_size - n) / (count(n) * block_size) for n in lengths) / len(lengths)
    return (held - sum(lengths)) / (held if divide_by == "held" else sum(lengths))


def blocks_after_parallel_sampling(prompt_len, num_samples, output_len, block_size, *, share=True,
                                   shared="full prompt blocks", end="ceil"):
    full = {"full prompt blocks": prompt_len // block_size, "every prompt block": -(-prompt_len // block_size),
            "all but the last": (prompt_len - 1) // block_size}[shared]
    total = -(-(prompt_len + output_len) // block_size) if end == "ceil" else (prompt_len + output_len) // block_size + 1
    return full + num_samples * (total - full) if share else num_samples * total


# ---------------------------------------------------------------------------------------------
# 02 · batching

def _batches(output_lens, num_slots, order="arrival", partial=True):
    lens = sorted(output_lens) if order == "sorted" else list(output_lens)
    stop = len(lens) if partial else len(lens) - num_slots + 1
    return [lens[i:i + num_slots] for i in range(0, stop, num_slots)]


def static_steps(output_lens, num_slots, *, order="arrival", partial=True, per_batch="longest"):
    pick = {"longest": max, "shortest": min}[per_batch]
    return sum(pick(batch) for batch in _batches(output_lens, num_slots, order, partial))


def static_idle_slot_steps(output_lens, num_slots, *, order="arrival", empty_slots=True):
    return sum(max(batch) * (num_slots if empty_slots else len(batch)) - sum(batch)
               for batch in _batches(output_lens, num_slots, order))


def continuous_steps(output_lens, num_slots, *, assign="the slot that frees first", refill_delay=0):
    if assign == "total work / slots":
        return -(-sum(output_lens) // num_slots)
    if assign == "round robin":
        slots = [0] * num_slots
        for i, n in enumerate(output_lens):
            slots[i % num_slots] += n
        return max(slots)
    free_at = [0] * num_slots
    for i, n in enumerate(output_lens):
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + n + (refill_delay if i >= num_slots else 0))
    return max(free_at)


# ---------------------------------------------------------------------------------------------
# 03 · scheduler

def block_hash_chain(token_ids, block_size, cache_salt=None, *, blocks="full", salt="block 0", chain=True):
    count = {"full": len(token_ids) // block_size, "ceil": -(-len(token_ids) // block_size),
             "one more": len(token_ids) // block_size + 1}[blocks]
    hashes, parent = [], None
    for i in range(count):
        if salt == "always a tuple":
            extra = (cache_salt,) if i == 0 else None
        else:
            extra = (cache_salt,) if cache_salt is not None and (i == 0 or salt == "every block") else None
        parent = hash_block_tokens(parent if chain else None, token_ids[i * block_size:(i + 1) * block_size], extra)
        hashes.append(parent)
    return hashes


def cached_prefix_tokens(block_hashes, cached, num_prompt_tokens, block_size, *, usable="not the last token",
                         stop_at_miss=True, skip_leading_misses=False):
    limit = {"not the last token": (num_prompt_tokens - 1) // block_size, "every block": len(block_hashes),
             "all but the last full block": num_prompt_tokens // block_size - 1}[usable]
    hits, started = 0, not skip_leading_misses
    for block_hash in block_hashes[:limit]:
        if block_hash in cached:
            hits, started = hits + 1, True
        elif started and stop_at_miss:
            break
    return hits * block_size


def plan_step(running, waiting, budget, max_num_seqs, long_prefill_token_threshold=0, *, stop_when_spent=True,
              count_running=True, cap_running=True, zero_threshold="no cap", order="running first",
              whole_prompts=False, running_that_fit=False, running_order="queue", capped_ends_turn=False,
              running_limit=None, admit_while="fewer than max_num_seqs"):
    plan, seqs = {}, len(running) if count_running else 0
    queue_order = [request_id for request_id, _ in list(running) + list(waiting)]

    def take(tokens_left, capped=True):
        if capped and (long_prefill_token_threshold or zero_threshold == "a cap of 0"):
            tokens_left = min(tokens_left, long_prefill_token_threshold)
        return min(tokens_left, budget)

    def serve_running():
        nonlocal budget
        queue = running if running_order == "queue" else sorted(running, key=lambda r: r[1])
        for request_id, tokens_left in (queue[:max_num_seqs] if running_limit == "max_num_seqs" else queue):
            if budget <= 0 and stop_when_spent:
                break
            if running_that_fit and take(tokens_left, cap_running) < min(
                    tokens_left, long_prefill_token_threshold or tokens_left):
                continue  # a running request that does not fit whole waits: starved
            plan[request_id] = take(tokens_left, cap_running)
            budget -= plan[request_id]
            if capped_ends_turn and plan[request_id] < tokens_left:
                break

    def serve_waiting():
        nonlocal budget, seqs
        for request_id, tokens_left in waiting:
            if (budget <= 0 and stop_when_spent) or (seqs >= max_num_seqs if admit_while == "fewer than max_num_seqs"
                                                     else seqs > max_num_seqs):
                break
            if whole_prompts and take(tokens_left) < min(tokens_left, long_prefill_token_threshold or tokens_left):
                continue
            plan[request_id] = take(tokens_left)
            budget -= plan[request_id]
            seqs += 1

    for serve in ((serve_running, serve_waiting) if order == "running first" else (serve_waiting, serve_running)):
        serve()
    return {request_id: plan[request_id] for request_id in queue_order if request_id in plan}  # in queue order


# ---------------------------------------------------------------------------------------------
# 04 · roofline

def step_intensity(model_name, gpu_name, requests, *, attention=True, pairs="causal", flop_params="active",
                   byte_params="all", weights_read="once per step", kv_traffic="read and write",
                   ridge="the GPU's", at_ridge="compute", bound="by the ridge point"):
    from course_lib.perf.hardware import get_gpu
    from course_lib.perf.models import get_model

    model, gpu = get_model(model_name), get_gpu(gpu_name)
    new_tokens = sum(new for _, new in requests)
    context_tokens = sum(cached + new for cached, new in requests)
    count = {"causal": lambda cached, new: new * cached + new * (new + 1) // 2,
             "cached only": lambda cached, new: new * cached}["cached only" if pairs == "cached only" else "causal"]
    flops = 2 * (model.active_params if flop_params == "active" else model.num_params) * new_tokens
    if attention:
        attended = sum(count(c, n) for c, n in requests) if pairs != "pooled" else count(
            sum(c for c, _ in requests), new_tokens)  # "pooled": every new token attends every request's cache
        flops += 4 * model.num_layers * model.num_heads * model.head_dim * attended
    weights = 2 * (model.num_params if byte_params == "all" else model.active_params)
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    kv_tokens = {"read and write": context_tokens + new_tokens, "cached only": sum(c for c, _ in requests)}[kv_traffic]
    moved = weights * (1 if weights_read == "once per step" else len(requests)) + kv_per_token * kv_tokens
    intensity = flops / moved
    ridge_point = {"the GPU's": gpu.bf16_flops / gpu.hbm_bandwidth, "H100's": 989e12 / 3.35e12,
                   "rounded": round(gpu.bf16_flops / gpu.hbm_bandwidth)}[ridge]
    above = intensity >= ridge_point if at_ridge == "compute" else intensity > ridge_point
    above = {"by the ridge point": above, "always memory": False, "always compute": True}[bound]
    return {"flops": flops, "bytes": moved, "intensity": intensity, "bound": "compute" if above else "memory"}


def verify_greedy(draft_token_ids, target_argmax_ids, *, bonus=True, after_mismatch="stop", at_mismatch="target",
                  match="same position"):
    emitted = []
    for i, (draft, target) in enumerate(zip(draft_token_ids, target_argmax_ids)):
        if draft == target if match == "same position" else draft in target_argmax_ids[i:]:
            emitted.append(draft)
        elif after_mismatch == "go on":
            emitted.append(target)
        else:
            return emitted + {"target": [target], "draft": [draft], "nothing": []}[at_mismatch]
    return emitted + [target_argmax_ids[len(emitted)]] if bonus else emitted


def rejection_step(target_probs, draft_probs, draft_token, generator, *, accept="min(1, p/q)", residual="max(0, p - q)"):
    p, q, x = target_probs, draft_probs, draft_token
    chance = {"min(1, p/q)": lambda: min(1.0, float(p[x] / q[x])), "p": lambda: float(p[x]),
              "always": lambda: 1.0, "min(1, q/p)": lambda: min(1.0, float(q[x] / p[x]))}[accept]()
    if float(torch.rand(1, generator=generator)) < chance:
        return x
    left = {"max(0, p - q)": torch.clamp(p - q, min=0), "p": p, "q": q, "|p - q|": (p - q).abs()}[residual]
    return int(torch.multinomial(left / left.sum(), 1, generator=generator))


def prefill_per_decode(num_seqs, tpot_s, output_len, prefill_requests_per_s, *, tokens="num_seqs / tpot_s",
                       requests="tokens / output_len", ratio="decode / prefill"):
    decode_tokens_per_s = num_seqs / tpot_s if tokens == "num_seqs / tpot_s" else num_seqs * tpot_s
    decode_requests_per_s = decode_tokens_per_s / output_len if requests == "tokens / output_len" else decode_tokens_per_s
    value = {"decode / prefill": decode_requests_per_s / prefill_requests_per_s,
             "prefill / decode": prefill_requests_per_s / decode_requests_per_s,
             "decode x prefill": decode_requests_per_s * prefill_requests_per_s,
             "whole instances": math.ceil(decode_requests_per_s / prefill_requests_per_s)}[ratio]
    return {"decode_tokens_per_s": decode_tokens_per_s, "decode_requests_per_s": decode_requests_per_s,
            "prefill_per_decode": value}


# ---------------------------------------------------------------------------------------------
# 05 · collectives (on ranks)

def all_reduce_via_shards(tensor, *, gather=True, in_place=True, mean=False, plain_all_reduce=False):
    if plain_all_reduce:
        dist.all_reduce(tensor)
        return
    world = dist.get_world_size()
    shard = torch.empty(tensor.numel() // world, dtype=tensor.dtype)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter(shard, tensor)
    if mean:
        shard /= world
    if gather:
        all_gather(tensor if in_place else torch.empty_like(tensor), shard)


def all_reduce_via_root(tensor, *, broadcast_from=0, broadcast=True, in_place=True, plain_all_reduce=False):
    if plain_all_reduce:
        dist.all_reduce(tensor)
        return tensor
    target = tensor if in_place else tensor.clone()
    dist.reduce(target, dst=0)
    if broadcast:
        dist.broadcast(target, src=broadcast_from)
    return target


def average_gradients(model, *, divide_by="world size", write_back=True):
    world = dist.get_world_size()
    for parameter in model.parameters():
        grad = parameter.grad if write_back else parameter.grad.clone()
        dist.all_reduce(grad)
        grad /= {"world size": world, "2": 2, "nothing": 1}[divide_by]


# ---------------------------------------------------------------------------------------------
# 06 · ring vs tree

def ring_schedule(rank, world_size, *, steps_per_phase="N-1", phases="scatter-reduce first", receive_from=-1,
                  gather_sends="the chunk it completed", names=("scatter-reduce", "all-gather")):
    n = world_size
    k = n - 1 if steps_per_phase == "N-1" else n
    scatter = [(names[0], (rank - s) % n, (rank - s + receive_from) % n) for s in range(k)]
    start = 1 if gather_sends == "the chunk it completed" else 0
    gather = [(names[1], (rank + start - s) % n, (rank + start - s + receive_from) % n) for s in range(k)]
    return scatter + gather if phases == "scatter-reduce first" else gather + scatter


def my_ring_all_reduce(tensor, *, split="tensor_split", gather=True, gather_adds=False, plain_all_reduce=False):
    if plain_all_reduce:
        dist.all_reduce(tensor)
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = tensor.tensor_split(world) if split == "tensor_split" else tensor.chunk(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    for phase, send, receive in ring_schedule(rank, world):
        if phase == "all-gather" and not gather:
            break
        buffer = torch.empty_like(chunks[receive]) if phase == "scatter-reduce" or gather_adds else chunks[receive]
        request = dist.isend(chunks[send], dst=right)
        dist.recv(buffer, src=left)
        request.wait()
        if phase == "scatter-reduce" or gather_adds:
            chunks[receive].add_(buffer)


def faster_algorithm(n, num_bytes, alpha, beta, *, tie="ring", tree_latency_hops=2, ring_bytes="2(N-1)/N",
                     ring_latency_steps="2(N-1)", tree_bytes=4, terms="latency and bandwidth"):
    alpha = 0 if terms == "bandwidth only" else alpha
    beta = 0 if terms == "latency only" else beta
    ring = ((2 * (n - 1) if ring_latency_steps == "2(N-1)" else n - 1) * alpha
            + (2 * (n - 1) / n if ring_bytes == "2(N-1)/N" else 2) * num_bytes * beta)
    tree = tree_latency_hops * math.log2(n) * alpha + tree_bytes * num_bytes * beta
    return "ring" if (ring <= tree if tie == "ring" else ring < tree) else "tree"


# ---------------------------------------------------------------------------------------------
# 07 · NCCL topology

BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1, "reduce": lambda n: 1}


def bandwidths(collective, num_bytes, seconds, num_ranks, *, factor=None, gb=1e9, one_rank="as N", swapped=False):
    factor_of = (factor or {}).get(collective, BUS_FACTORS[collective])
    algbw = num_bytes / seconds / gb
    busbw = algbw * factor_of(num_ranks)
    if num_ranks == 1 and one_rank == "factor 1":
        busbw = algbw
    if num_ranks == 1 and one_rank == "nothing moves":
        busbw = 0.0
    return (busbw, algbw) if swapped else (algbw, busbw)


def my_hierarchical_all_reduce(tensor, ranks_per_node, *, plan="shards across", pad=True, shard_of="ranks per node"):
    world, per_node = dist.get_world_size(), ranks_per_node
    node, local_rank = divmod(dist.get_rank(), per_node)
    in_node = [dist.new_group(list(range(m * per_node, (m + 1) * per_node))) for m in range(world // per_node)]
    across = [dist.new_group(list(range(i, world, per_node))) for i in range(per_node)]
    if plan == "one all_reduce":
        dist.all_reduce(tensor)
        return
    if plan == "node, then whole tensor across":
        dist.all_reduce(tensor, group=in_node[node])
        dist.all_reduce(tensor, group=across[local_rank])
        return
    parts = per_node if shard_of == "ranks per node" else world
    shard_numel = math.ceil(tensor.numel() / parts) if pad else tensor.numel() // parts
    padded = torch.zeros(shard_numel * per_node, dtype=tensor.dtype) if pad else tensor
    padded[:tensor.numel()] = tensor
    shard = torch.empty(shard_numel, dtype=tensor.dtype)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter(shard, padded, group=in_node[node])
    dist.all_reduce(shard, group=across[local_rank] if plan == "shards across" else None)
    all_gather(padded, shard, group=in_node[node])
    tensor.copy_(padded[:tensor.numel()])


def my_assign_buckets(param_bytes, bucket_cap_bytes, first_bucket_cap_bytes, *, walk="last to first",
                      close="at the cap", caps="first for bucket 0", last_bucket="if not empty", inner="ready order"):
    buckets, bucket, held = [], [], 0
    order = reversed(range(len(param_bytes))) if walk == "last to first" else range(len(param_bytes))
    for index in order:
        first = {"first for bucket 0": not buckets, "bucket cap for all": False, "first for all": True}[caps]
        cap = first_bucket_cap_bytes if first else bucket_cap_bytes
        if close == "before adding" and bucket and held + param_bytes[index] > cap:
            buckets.append(bucket)
            bucket, held = [], 0
        bucket.append(index)
        held += param_bytes[index]
        if {"at the cap": held >= cap, "over the cap": held > cap, "a byte early": held >= cap - 1,
                "before adding": False}[close]:
            buckets.append(bucket)
            bucket, held = [], 0
    if bucket or last_bucket == "always":
        buckets.append(bucket)
    if last_bucket == "never" and bucket:
        buckets.pop()
    return [sorted(b) for b in buckets] if inner == "ascending" else buckets


def install_bucketed_reducer(model, buckets, *, async_op=True, launch="when its last gradient arrives",
                             wait="in finish", divide=True):
    parameters = list(model.parameters())
    missing = [len(bucket) for bucket in buckets]
    bucket_of = {index: b for b, bucket in enumerate(buckets) for index in bucket}
    launched = []

    def start(b):
        flat = torch.cat([parameters[i].grad.reshape(-1) for i in buckets[b]])
        work = dist.all_reduce(flat, async_op=async_op)
        if wait == "in the hook" and async_op:
            work.wait()
        launched.append((work, flat, buckets[b]))

    def ready(index):
        if launch == "one per parameter":
            flat = parameters[index].grad.reshape(-1).clone()
            launched.append((dist.all_reduce(flat, async_op=True), flat, [index]))
            return
        b = bucket_of[index]
        missing[b] -= 1
        if launch == "when its last gradient arrives" and missing[b] == 0:
            start(b)
        if launch == "at its lowest index (reverse order assumed)" and index == min(buckets[b]):
            start(b)
        if launch == "with its first gradient" and missing[b] == len(buckets[b]) - 1:
            start(b)

    for index, parameter in enumerate(parameters):
        parameter.register_post_accumulate_grad_hook(lambda _, index=index: ready(index))

    def finish():
        if launch == "all in finish":
            for b in range(len(buckets)):
                start(b)
        for work, flat, bucket in launched:
            if async_op:
                work.wait()
            if divide:
                flat /= dist.get_world_size()
            offset = 0
            for i in bucket:
                grad = parameters[i].grad
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    return finish


# ---------------------------------------------------------------------------------------------
# 08 · fused TP

def tensor_parallel_mlp(x, a, b, *, all_reduce=True, own_shards=True, mean=False, approximate="none", world=None,
                        gather=False):
    rank, ranks = dist.get_rank(), world or dist.get_world_size()
    if not own_shards:
        return F.gelu(x @ a) @ b
    per_rank = a.shape[1] // ranks
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    partial = F.gelu(x @ a[:, mine], approximate=approximate) @ b[mine, :]
    if gather:  # every rank's partial output gathered, then summed here: the same sum, another collective
        pieces = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, partial)
        return sum(pieces)
    if all_reduce:
        dist.all_reduce(partial)
    if mean:
        partial /= dist.get_world_size()
    return partial


def my_one_shot_all_reduce(tensor, buffers, *, wait=True, own=True, peers_read=None, returns=True,
                           dist_all_reduce=False):
    flat, views = buffers.begin(tensor)
    buffers.signal()
    if wait:
        buffers.wait()
    if dist_all_reduce:
        dist.all_reduce(tensor)
        return tensor
    rank = dist.get_rank()
    read = [view for r, view in enumerate(views[:peers_read] if peers_read else views) if own or r != rank]
    flat.copy_(read[0])
    for view in read[1:]:
        flat.add_(view)
    return tensor if returns else None


def dispatch_splits(experts, num_experts, world_size, *, count="pairs", placement="blocks", every_rank=True,
                    order="rank 0 first"):
    per_rank = num_experts // world_size
    if count == "per expert":
        return torch.bincount(experts.reshape(-1), minlength=num_experts).tolist()
    if count == "tokens":
        return [sum(any(e // per_rank == r for e in row) for row in experts.tolist()) for r in range(world_size)]
    ranks = experts.reshape(-1) // per_rank if placement == "blocks" else experts.reshape(-1) % world_size
    splits = torch.bincount(ranks, minlength=world_size if every_rank else 0).tolist()
    return splits[::-1] if order == "reversed" else splits


# ---------------------------------------------------------------------------------------------
# 09 · serving trade-offs

def quantize_int4(weight, group_size, symmetric, *, symmetric_steps=7, asymmetric_steps=15, widen_to_zero=True,
                  zero_group_scale=1.0, rounding="nearest", groups="per group", check_width=True):
    n, k = weight.shape
    if k % group_size:
        if check_width:
            raise ValueError(f"K = {k} is not a multiple of group_size = {group_size}")
        weight, k = weight[:, :k - k % group_size], k - k % group_size
    w = weight.float().reshape(n, k // group_size, group_size)

    def over(reduce):  # the statistic over each group, each row or the whole tensor, as [N, K // group_size]
        if groups == "per group":
            return reduce(w, dim=-1)
        if groups == "per row":
            return reduce(w.reshape(n, -1), dim=-1)[:, None].expand(n, k // group_size).clone()
        return reduce(w.reshape(-1), dim=-1).expand(n, k // group_size).clone()

    round_ = {"nearest": torch.round, "floor": torch.floor}[rounding]
    if symmetric:
        scales = over(lambda t, dim: t.abs().amax(dim=dim)) / symmetric_steps
        scales = torch.where(scales > 0, scales, torch.full_like(scales, zero_group_scale))
        codes = round_(w / scales[..., None]).clamp(-8, 7)
        zeros = None
    else:
        lo, hi = over(torch.amin), over(torch.amax)
        if widen_to_zero:
            lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        scales = (hi - lo) / asymmetric_steps
        scales = torch.where(scales > 0, scales, torch.full_like(scales, zero_group_scale))
        zeros = torch.round(-lo / scales).clamp(0, 15)
        codes = (round_(w / scales[..., None]) + zeros[..., None]).clamp(0, 15)
        zeros = zeros.to(torch.int64)
    return codes.reshape(n, k).to(torch.int64), scales, zeros


def dequantize_int4(codes, scales, zeros, group_size, *, subtract_zero=True, offset=0):
    n, k = codes.shape
    centred = codes.float().reshape(n, k // group_size, group_size) + offset
    if zeros is not None and subtract_zero:
        centred = centred - zeros.float()[..., None]
    return (centred * scales.float()[..., None]).reshape(n, k)


def with_dequantize(**switches) -> Callable:
    """The correct quantize_int4, beside a dequantize_int4 with ``switches`` (the grader finds it there)."""
    return variant(quantize_int4, {"dequantize_int4": variant(dequantize_int4, **switches)})


def reload_or_recompute(model, tokens, tier, flops, include_attention=False, *, latency="once", gb=1.0,
                        kv_heads="num_kv_heads", vectors=2, params="active", attention="causal", tie="reload",
                        decide_by="both times"):
    heads = {"num_kv_heads": model.num_kv_heads, "num_heads": model.num_heads, "Llama-3's 8": 8}[kv_heads]
    kv_bytes = tokens * vectors * model.num_layers * heads * model.head_dim * 2
    copy_s = kv_bytes / (tier.bandwidth * gb)
    reload_s = copy_s + {"once": 1, "left out": 0, "twice": 2}[latency] * tier.latency_s
    work = 2 * (model.active_params if params == "active" else model.num_params) * tokens
    per_pair = 4 * model.num_layers * model.num_heads * model.head_dim
    if include_attention and attention == "causal":
        work += per_pair * tokens * (tokens + 1) / 2
    if include_attention and attention == "n^2 / 2":
        work += per_pair * tokens * tokens / 2
    if attention == "always counted":
        work += per_pair * tokens * (tokens + 1) / 2
    recompute_s = work / flops
    judged = copy_s if decide_by == "copy time only" else reload_s
    reload_wins = judged <= recompute_s if tie == "reload" else judged < recompute_s
    if decide_by == "the slower wins":
        reload_wins = not reload_wins
    return {"decision": "reload" if reload_wins else "recompute", "reload_s": reload_s, "recompute_s": recompute_s}


def best_scheme(model, gpu, batch, context_len=1024, *, scale_bits=True, kv=True, kv_tokens="context + 2",
                attention_roof="bf16", overhead_s=0.0005, efficiency=True, roofs=("compute", "memory"),
                weight_params="all", tie="earlier scheme", fp8_everywhere=False, best_by="step time"):
    bytes_per_weight = {"BF16": 2, "W4A16": (4 + (16 / 128 if scale_bits else 0)) / 8, "FP8-W8A8": 1}
    tokens = {"context + 2": context_len + 2, "context + 1": context_len + 1}[kv_tokens]
    kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 * tokens * batch if kv else 0
    linear = 2 * model.active_params * batch
    attention = 4 * model.num_layers * model.num_heads * model.head_dim * (context_len + 1) * batch
    compute_share, memory_share = (0.5, 0.8) if efficiency else (1.0, 1.0)
    weights = model.num_params if weight_params == "all" else model.active_params
    step_s = {}
    for name, per_weight in bytes_per_weight.items():
        peak = gpu.fp8_flops if name == "FP8-W8A8" else gpu.bf16_flops
        if not peak and fp8_everywhere:
            peak = gpu.bf16_flops
        if not peak:
            step_s[name] = None
            continue
        attention_peak = gpu.bf16_flops if attention_roof == "bf16" else peak
        memory_s = (weights * per_weight + kv_bytes) / (memory_share * gpu.hbm_bandwidth)
        compute_s = linear / (compute_share * peak) + attention / (compute_share * attention_peak)
        step_s[name] = max(t for t, roof in ((compute_s, "compute"), (memory_s, "memory")) if roof in roofs) + overhead_s
    names = [name for name, t in step_s.items() if t is not None]
    best = min(names, key=step_s.get) if tie == "earlier scheme" else min(reversed(names), key=step_s.get)
    if best_by == "fewest bytes":
        best = "W4A16"
    if best_by == "the H100's crossover batch, 160":
        best = "FP8-W8A8" if batch >= 160 and "FP8-W8A8" in names else "W4A16"
    if best_by == "the fastest tensor cores":
        best = "FP8-W8A8" if "FP8-W8A8" in names else "BF16"
    return {"best": best, "step_s": step_s}


# ---------------------------------------------------------------------------------------------
# The tables: per task, each stated rule, the hand-built case that states it (a part of its
# ``why``), and a variant that breaks that rule alone.

RANDOM = ""  # a rule no hand-built case names, caught by the seeded random cases (whose why is "")


@dataclass(frozen=True)
class Rule:
    function: str
    rule: str
    case: str | None      # part of the why of the hand-built case that must catch it; None for a gap
    wrong: Callable
    gap: str = ""         # why no case catches it yet (the row is xfail(strict=True) until one does)


V = variant

PAGING = [
    Rule("kv_bytes_per_token", "a key AND a value vector per token", "GQA, 8 KV heads",
         V(kv_bytes_per_token, vectors=1)),
    Rule("kv_bytes_per_token", "every layer stores its own", "GQA, 8 KV heads", V(kv_bytes_per_token, per_layer=False)),
    Rule("kv_bytes_per_token", "one vector per KV head", "MHA, a KV head per query head",
         V(kv_bytes_per_token, per_kv_head=False)),
    Rule("kv_bytes_per_token", "the dtype's bytes per element", "fp8: one byte per element",
         V(kv_bytes_per_token, element_bytes=2)),
    Rule("kv_blocks_available", "never negative", "never negative", V(kv_blocks_available, clamp=False)),
    Rule("kv_blocks_available", "whole blocks only: round down", "one byte short",
         V(kv_blocks_available, rounding="up")),
    Rule("kv_blocks_available", "whole blocks only: not to the nearest", "one byte short",
         V(kv_blocks_available, rounding="nearest")),
    Rule("kv_blocks_available", "a block that fits exactly counts", "exactly 4 blocks are left",
         V(kv_blocks_available, rounding="strictly below")),
    Rule("kv_blocks_available", "subtract the activation peak", "nothing left at all",
         V(kv_blocks_available, activations=False)),
    Rule("kv_blocks_available", "the utilization is a share of the whole GPU", "80 GiB at 0.30",
         V(kv_blocks_available, share_of="what is left")),
    Rule("paged_waste_fraction", "a share of the slots held", "100, 17 and 16",
         V(paged_waste_fraction, divide_by="stored")),
    Rule("paged_waste_fraction", "all slots together, not a mean of requests", "100, 17 and 16",
         V(paged_waste_fraction, divide_by="each request's own")),
    Rule("paged_waste_fraction", "a request holds ceil(length / block_size) blocks", "one token in a 16-token block",
         V(paged_waste_fraction, blocks="floor")),
    Rule("paged_waste_fraction", "a full block needs no extra block", "fill their blocks exactly",
         V(paged_waste_fraction, blocks="one more")),
    Rule("paged_waste_fraction", "1-token blocks waste nothing", "1-token blocks waste nothing",
         V(paged_waste_fraction, blocks="one more")),
    Rule("blocks_after_parallel_sampling", "the prompt's full blocks are shared", "a 512-token prompt",
         V(blocks_after_parallel_sampling, share=False)),
    Rule("blocks_after_parallel_sampling", "a partly filled prompt block is copied per sample",
         "partly filled last prompt block", V(blocks_after_parallel_sampling, shared="every prompt block")),
    Rule("blocks_after_parallel_sampling", "a prompt of whole blocks copies nothing", "a prompt of whole blocks",
         V(blocks_after_parallel_sampling, shared="all but the last")),
    Rule("blocks_after_parallel_sampling", "ceil: an output ending on a boundary needs no extra block",
         "exactly on a block boundary", V(blocks_after_parallel_sampling, end="floor + 1")),
]

BATCHING = [
    Rule("static_steps", "each batch runs to its longest request", "one 2000-token request",
         V(static_steps, per_batch="shortest")),
    Rule("static_steps", "batches form in arrival order", "arrival order, not sorted", V(static_steps, order="sorted")),
    Rule("static_steps", "a batch that is not full still runs", "fewer requests than slots",
         V(static_steps, partial=False)),
    Rule("static_idle_slot_steps", "an empty slot is idle for the whole batch", "half empty",
         V(static_idle_slot_steps, empty_slots=False)),
    Rule("static_idle_slot_steps", "batches form in arrival order", "batches form in arrival order",
         V(static_idle_slot_steps, order="sorted")),
    Rule("continuous_steps", "the next request takes the slot that frees first", "frees first",
         V(continuous_steps, assign="round robin")),
    Rule("continuous_steps", "one long request can finish last: not total work / slots", "eight batches",
         V(continuous_steps, assign="total work / slots")),
    Rule("continuous_steps", "fewer requests than slots: the longest decides", "fewer requests than slots",
         V(continuous_steps, assign="total work / slots")),
    Rule("continuous_steps", "a freed slot is refilled in the same step", "slots that free in the same step",
         V(continuous_steps, refill_delay=1)),
]

SCHEDULER = [
    Rule("block_hash_chain", "a partial block gets no hash", "a partial block gets no hash",
         V(block_hash_chain, blocks="ceil")),
    Rule("block_hash_chain", "no tokens, no blocks", "no tokens: no blocks", V(block_hash_chain, blocks="one more")),
    Rule("block_hash_chain", "each block's parent is the previous block's hash", "two full blocks and a partial one",
         V(block_hash_chain, chain=False)),
    Rule("block_hash_chain", "the salt goes into block 0 only", "the salt goes into block 0 only",
         V(block_hash_chain, salt="every block")),
    Rule("block_hash_chain", "no salt: extra keys None, not (None,)", "no salt",
         V(block_hash_chain, salt="always a tuple")),
    Rule("cached_prefix_tokens", "the prompt's last token is always computed", "last token must be computed",
         V(cached_prefix_tokens, usable="every block")),
    Rule("cached_prefix_tokens", "stop at the first miss", "a miss at block 1",
         V(cached_prefix_tokens, stop_at_miss=False)),
    Rule("cached_prefix_tokens", "a miss at block 0 serves nothing", "a miss at block 0",
         V(cached_prefix_tokens, skip_leading_misses=True)),
    Rule("cached_prefix_tokens", "with a partial last block every full block can hit", "a partial last block",
         V(cached_prefix_tokens, usable="all but the last full block")),
    Rule("cached_prefix_tokens", "(n - 1) // block_size blocks, not n // block_size - 1", "13 tokens",
         V(cached_prefix_tokens, usable="all but the last full block")),
    Rule("plan_step", "running requests first, then waiting ones", "a decode, a long prefill",
         V(plan_step, order="waiting first")),
    Rule("plan_step", "a request that gets no tokens gets no entry", "nobody else gets an entry",
         V(plan_step, stop_when_spent=False)),
    Rule("plan_step", "max_num_seqs counts the running requests", "max_num_seqs counts the running requests too",
         V(plan_step, count_running=False)),
    Rule("plan_step", "no admission once the running requests fill max_num_seqs: >=, not >",
         "running requests already fill max_num_seqs", V(plan_step, admit_while="at most max_num_seqs")),
    Rule("plan_step", "max_num_seqs only stops admissions, never a running request", "max_num_seqs only stops admissions",
         V(plan_step, running_limit="max_num_seqs")),
    Rule("plan_step", "a capped prefill does not end the running requests' turn", "a capped prefill does not end",
         V(plan_step, capped_ends_turn=True)),
    Rule("plan_step", "a budget spent exactly at a prompt's end leaves nothing for the next: <= 0",
         "the budget is spent exactly at the end of a prompt", V(plan_step, stop_when_spent=False)),
    Rule("plan_step", "the threshold caps running requests too", "the threshold caps running requests too",
         V(plan_step, cap_running=False)),
    Rule("plan_step", "a threshold of 0 means no cap", "a threshold of 0 means no cap",
         V(plan_step, zero_threshold="a cap of 0")),
    Rule("plan_step", "a prompt may be cut where the budget runs out", "the budget runs out partway",
         V(plan_step, whole_prompts=True)),
    Rule("plan_step", "a running request that does not fit whole gets what the budget has left",
         "a threshold of 0 means no cap", V(plan_step, running_that_fit=True)),
    Rule("plan_step", "running requests in queue order: a long one is never starved for later, shorter ones",
         "queue order: the budget runs out on the long running request", V(plan_step, running_order="shortest first")),
]

ROOFLINE = [
    Rule("step_intensity", "attention's FLOPs count", "every new token attends them all",
         V(step_intensity, attention=False)),
    Rule("step_intensity", "new token i attends cached + i + 1 tokens", "every new token attends them all",
         V(step_intensity, pairs="cached only")),
    Rule("step_intensity", "FLOPs use the active parameters", "a mixture of experts",
         V(step_intensity, flop_params="all")),
    Rule("step_intensity", "bytes read every parameter", "a mixture of experts",
         V(step_intensity, byte_params="active")),
    Rule("step_intensity", "one weight read per step, shared by the batch", "256 decodes share one weight read",
         V(step_intensity, weights_read="once per request")),
    Rule("step_intensity", "KV read for every context token and written for every new one", "each reads its own KV",
         V(step_intensity, kv_traffic="cached only")),
    Rule("step_intensity", "each request's new tokens attend its own cache", "a prefill and three decodes",
         V(step_intensity, pairs="pooled")),
    Rule("step_intensity", "compute-bound above the ridge point", "a long prefill: compute-bound",
         V(step_intensity, bound="always memory")),
    Rule("step_intensity", "a big enough batch crosses the ridge point", "512 short decodes cross the ridge point",
         V(step_intensity, bound="always memory")),
    Rule("step_intensity", "memory-bound below the ridge point", "a batch-1 decode: memory-bound",
         V(step_intensity, bound="always compute")),
    Rule("step_intensity", "the same step is memory-bound below the H100's ridge", "the same step on an H100",
         V(step_intensity, bound="always compute")),
    Rule("step_intensity", "the ridge point is the GPU's own", "A100, compute-bound",
         V(step_intensity, ridge="H100's")),
    Rule("step_intensity", "at or above the ridge point: compute", "exactly at the L4's ridge point",
         V(step_intensity, at_ridge="memory")),
    Rule("step_intensity", "the ridge point exactly, not rounded", "just below the ridge point",
         V(step_intensity, ridge="rounded")),
    Rule("verify_greedy", "all drafts match: plus the bonus token", "plus the bonus token",
         V(verify_greedy, bonus=False)),
    Rule("verify_greedy", "no drafts: the target's token alone", "no drafts", V(verify_greedy, bonus=False)),
    Rule("verify_greedy", "stop at the first mismatch", "does not count", V(verify_greedy, after_mismatch="go on")),
    Rule("verify_greedy", "the target's token replaces a rejected draft", "the target's token replaces it",
         V(verify_greedy, at_mismatch="draft")),
    Rule("verify_greedy", "a mismatch still emits the target's token", "the first draft is wrong",
         V(verify_greedy, at_mismatch="nothing")),
    Rule("verify_greedy", "a draft must match the target at its own position", "repeated tokens",
         V(verify_greedy, match="anywhere later")),
    Rule("rejection_step", "accept with min(1, p(x) / q(x))", "p(x) < q(x)", V(rejection_step, accept="always")),
    Rule("rejection_step", "the acceptance divides by q(x)", "p(x) < q(x)", V(rejection_step, accept="p")),
    Rule("rejection_step", "p(x) >= q(x) is always accepted", "p(x) >= q(x): always accepted",
         V(rejection_step, accept="min(1, q/p)")),
    Rule("rejection_step", "p(x) = 0 is always rejected", "p(x) = 0", V(rejection_step, accept="min(1, q/p)")),
    Rule("rejection_step", "a rejection samples max(0, p - q)", "tokens where p < q are never emitted",
         V(rejection_step, residual="p")),
    Rule("rejection_step", "a rejection never returns a token where p <= q", "q a point mass on x",
         V(rejection_step, residual="|p - q|")),
    Rule("rejection_step", "p == q is always accepted", "p == q", V(rejection_step, accept="p")),
    Rule("prefill_per_decode", "tokens per second: num_seqs / tpot_s", "1.28",
         V(prefill_per_decode, tokens="num_seqs x tpot_s")),
    Rule("prefill_per_decode", "a request is done after output_len tokens", "outputs twice as long",
         V(prefill_per_decode, requests="tokens")),
    Rule("prefill_per_decode", "decode requests over one prefill instance's", "1.28",
         V(prefill_per_decode, ratio="prefill / decode")),
    Rule("prefill_per_decode", "a faster prefill needs fewer instances", "a prefill instance twice as fast",
         V(prefill_per_decode, ratio="decode x prefill")),
    Rule("prefill_per_decode", "a ratio, not whole instances", "fewer than one prefill instance",
         V(prefill_per_decode, ratio="whole instances")),
]

COLLECTIVES = [
    Rule("all_reduce_via_shards", "all-gather the reduced shards: every rank ends with the sum",
         "three lengths that divide by N", V(all_reduce_via_shards, gather=False)),
    Rule("all_reduce_via_shards", "in place", "three lengths that divide by N",
         V(all_reduce_via_shards, in_place=False)),
    Rule("all_reduce_via_shards", "a sum, not a mean", "three lengths that divide by N",
         V(all_reduce_via_shards, mean=True)),
    Rule("all_reduce_via_shards", "only a reduce-scatter and an all-gather", "three lengths that divide by N",
         V(all_reduce_via_shards, plain_all_reduce=True)),
    Rule("all_reduce_via_root", "broadcast the root's sum", "lengths that need not divide by N",
         V(all_reduce_via_root, broadcast=False)),
    Rule("all_reduce_via_root", "broadcast from the root that holds the sum", "lengths that need not divide by N",
         V(all_reduce_via_root, broadcast_from=1)),
    Rule("all_reduce_via_root", "in place", "lengths that need not divide by N",
         V(all_reduce_via_root, in_place=False)),
    Rule("all_reduce_via_root", "dist.reduce to rank 0, then dist.broadcast", "lengths that need not divide by N",
         V(all_reduce_via_root, plain_all_reduce=True)),
    Rule("average_gradients", "a mean: divide the sum", "2 ranks, 4 rows each",
         V(average_gradients, divide_by="nothing")),
    Rule("average_gradients", "divide by the world size", "4 ranks, 4 rows each", V(average_gradients, divide_by="2")),
    Rule("average_gradients", "write the average back into .grad", "2 ranks, 4 rows each",
         V(average_gradients, write_back=False)),
]

RING_VS_TREE = [
    Rule("ring_schedule", "N-1 steps per phase", "rank 0 of 4", V(ring_schedule, steps_per_phase="N")),
    Rule("ring_schedule", "N-1 steps per phase, on the smallest ring too", "the smallest ring",
         V(ring_schedule, steps_per_phase="N")),
    Rule("ring_schedule", "scatter-reduce first, then all-gather", "rank 0 of 4",
         V(ring_schedule, phases="all-gather first")),
    Rule("ring_schedule", "the phases' exact names", "rank 0 of 4",
         V(ring_schedule, names=("reduce-scatter", "all-gather"))),
    Rule("ring_schedule", "receive from the left neighbour", "rank 0 of 4", V(ring_schedule, receive_from=1)),
    Rule("ring_schedule", "all-gather starts with the chunk the rank completed", "rank 0 of 4",
         V(ring_schedule, gather_sends="its own chunk")),
    Rule("my_ring_all_reduce", "chunks by tensor_split", "tensor.chunk would give 3",
         V(my_ring_all_reduce, split="chunk")),
    Rule("my_ring_all_reduce", "the all-gather phase spreads the sums", "chunks of unequal size",
         V(my_ring_all_reduce, gather=False)),
    Rule("my_ring_all_reduce", "the all-gather copies, never adds", "chunks of unequal size",
         V(my_ring_all_reduce, gather_adds=True)),
    Rule("my_ring_all_reduce", "point-to-point calls only", "chunks of unequal size",
         V(my_ring_all_reduce, plain_all_reduce=True)),
    Rule("faster_algorithm", "a tie goes to the ring", "a tie (2 ranks, nothing to send)",
         V(faster_algorithm, tie="tree")),
    Rule("faster_algorithm", "an exact tie goes to the ring", "an exact tie on 4 ranks",
         V(faster_algorithm, tie="tree")),
    Rule("faster_algorithm", "the tree's latency is 2 log2(N) alpha", "a tie (2 ranks, nothing to send)",
         V(faster_algorithm, tree_latency_hops=1)),
    Rule("faster_algorithm", "the ring sends 2(N-1)/N of the bytes", "the ring sends 2(N-1)/N of the bytes",
         V(faster_algorithm, ring_bytes="2")),
    Rule("faster_algorithm", "the ring's latency is 2(N-1) alpha", "the ring's 2(N-1) latency steps",
         V(faster_algorithm, ring_latency_steps="N-1")),
    Rule("faster_algorithm", "the tree sends 4 x the bytes", "the tree 4 times",
         V(faster_algorithm, tree_bytes=2)),
    Rule("faster_algorithm", "latency counts: small messages on many GPUs go to the tree", "4 KB on 512 GPUs",
         V(faster_algorithm, terms="bandwidth only")),
    Rule("faster_algorithm", "bandwidth counts: large messages go to the ring", "1 GiB on 8 GPUs",
         V(faster_algorithm, terms="latency only")),
]

NCCL_TOPOLOGY = [
    Rule("bandwidths", "all-reduce: 2(N-1)/N", "busbw 175 GB/s",
         V(bandwidths, factor={"all_reduce": lambda n: (n - 1) / n})),
    Rule("bandwidths", "all-reduce on 2 ranks: 2(N-1)/N = 1", "an all-reduce on 2 ranks",
         V(bandwidths, factor={"all_reduce": lambda n: (n - 1) / n})),
    Rule("bandwidths", "all-gather: (N-1)/N", "all-gather: (N-1)/N",
         V(bandwidths, factor={"all_gather": lambda n: 2 * (n - 1) / n})),
    Rule("bandwidths", "reduce-scatter: (N-1)/N", "reduce-scatter: (N-1)/N",
         V(bandwidths, factor={"reduce_scatter": lambda n: 1})),
    Rule("bandwidths", "all-to-all: (N-1)/N", "all-to-all: (N-1)/N", V(bandwidths, factor={"all_to_all": lambda n: 1})),
    Rule("bandwidths", "broadcast: 1", "broadcast: factor 1",
         V(bandwidths, factor={"broadcast": lambda n: (n - 1) / n})),
    Rule("bandwidths", "reduce: 1", "reduce: factor 1", V(bandwidths, factor={"reduce": lambda n: (n - 1) / n})),
    Rule("bandwidths", "a GB is 10^9 bytes", "a GB is 10^9 bytes", V(bandwidths, gb=2**30)),
    Rule("bandwidths", "(algbw, busbw), in that order", "a 1 GB all-reduce on 8 GPUs", V(bandwidths, swapped=True)),
    Rule("bandwidths", "one rank: an all-reduce's factor is 0", "one rank: an all-reduce moves nothing",
         V(bandwidths, one_rank="factor 1")),
    Rule("bandwidths", "one rank: (N-1)/N = 0", "one rank: (N-1)/N = 0", V(bandwidths, one_rank="factor 1")),
    Rule("bandwidths", "one rank: broadcast's factor stays 1", "one rank: broadcast's factor is 1",
         V(bandwidths, one_rank="nothing moves")),
    Rule("my_hierarchical_all_reduce", "only a shard crosses nodes", "2 nodes of 2 ranks",
         V(my_hierarchical_all_reduce, plan="one all_reduce")),
    Rule("my_hierarchical_all_reduce", "reduce-scatter inside the node before crossing", "3 nodes of 2 ranks",
         V(my_hierarchical_all_reduce, plan="node, then whole tensor across")),
    Rule("my_hierarchical_all_reduce", "across nodes only with the ranks holding the same shard", "2 nodes of 3 ranks",
         V(my_hierarchical_all_reduce, plan="shards across every rank")),
    Rule("my_hierarchical_all_reduce", "one node: the cross-node groups hold one rank each", "one node: nothing crosses",
         V(my_hierarchical_all_reduce, plan="shards across every rank")),
    Rule("my_hierarchical_all_reduce", "a shard is 1 / ranks_per_node of the tensor, not 1 / world size",
         "one rank per node", V(my_hierarchical_all_reduce, shard_of="world size")),
    Rule("my_hierarchical_all_reduce", "shards of ceil(numel / ranks_per_node), padded", "7 elements make shards of 4",
         V(my_hierarchical_all_reduce, pad=False)),
    Rule("my_assign_buckets", "walk from the last parameter", "reverse order",
         V(my_assign_buckets, walk="first to last")),
    Rule("my_assign_buckets", "indices in the order gradients become ready", "reverse order",
         V(my_assign_buckets, inner="ascending")),
    Rule("my_assign_buckets", "close when the bytes reach the cap: >=", "reach the cap exactly",
         V(my_assign_buckets, close="over the cap")),
    Rule("my_assign_buckets", "one byte short of the cap stays open", "one byte short of the cap",
         V(my_assign_buckets, close="a byte early")),
    Rule("my_assign_buckets", "add, then close: a bucket may overshoot", "may overshoot the cap",
         V(my_assign_buckets, close="before adding")),
    Rule("my_assign_buckets", "a parameter larger than the cap closes the bucket it joins", "closes the bucket it joins",
         V(my_assign_buckets, close="before adding")),
    Rule("my_assign_buckets", "only bucket 0 has the first cap", "only bucket 0 has the first bucket's cap",
         V(my_assign_buckets, caps="first for all")),
    Rule("my_assign_buckets", "bucket 0 closes at the first cap", "DDP's defaults",
         V(my_assign_buckets, caps="bucket cap for all")),
    Rule("my_assign_buckets", "no empty bucket at the end", "no empty bucket after it",
         V(my_assign_buckets, last_bucket="always")),
    Rule("my_assign_buckets", "one parameter, one bucket", "one parameter", V(my_assign_buckets, last_bucket="always")),
    Rule("my_assign_buckets", "the open bucket is kept at the end", "everything fits: one bucket",
         V(my_assign_buckets, last_bucket="never")),
    Rule("install_bucketed_reducer", "launch asynchronously", "3 buckets", V(install_bucketed_reducer, async_op=False)),
    Rule("install_bucketed_reducer", "launch a bucket as soon as its last gradient arrives", "3 buckets",
         V(install_bucketed_reducer, launch="all in finish")),
    Rule("install_bucketed_reducer", "wait in finish(), never during backward", "3 buckets",
         V(install_bucketed_reducer, wait="in the hook")),
    Rule("install_bucketed_reducer", "count each bucket's missing gradients", "parameters() lists the middle layer first",
         V(install_bucketed_reducer, launch="at its lowest index (reverse order assumed)")),
    Rule("install_bucketed_reducer", "launch with the bucket's last gradient, not its first",
         "one bucket: launched with the last gradient", V(install_bucketed_reducer, launch="with its first gradient")),
    Rule("install_bucketed_reducer", "one all-reduce per bucket, not per parameter", "3 buckets",
         V(install_bucketed_reducer, launch="one per parameter")),
    Rule("install_bucketed_reducer", "average: divide by the ranks", "4 ranks, 2 buckets",
         V(install_bucketed_reducer, divide=False)),
]

FUSED_TP = [
    Rule("tensor_parallel_mlp", "all-reduce the partial output", "TP=2", V(tensor_parallel_mlp, all_reduce=False)),
    Rule("tensor_parallel_mlp", "use only this rank's shards", "TP=2", V(tensor_parallel_mlp, own_shards=False)),
    Rule("tensor_parallel_mlp", "the sum, not the mean", "TP=2", V(tensor_parallel_mlp, mean=True)),
    Rule("tensor_parallel_mlp", "the exact GeLU", "TP=2", V(tensor_parallel_mlp, approximate="tanh")),
    Rule("tensor_parallel_mlp", "one all_reduce, no other collective", "TP=2", V(tensor_parallel_mlp, gather=True)),
    Rule("tensor_parallel_mlp", "the shard is hidden / world size", "TP=4", V(tensor_parallel_mlp, world=2)),
    Rule("my_one_shot_all_reduce", "wait after signalling, before reading", "2 ranks, five calls",
         V(my_one_shot_all_reduce, wait=False)),
    Rule("my_one_shot_all_reduce", "add this rank's own tensor too", "2 ranks, five calls",
         V(my_one_shot_all_reduce, own=False)),
    Rule("my_one_shot_all_reduce", "return the tensor", "2 ranks, five calls",
         V(my_one_shot_all_reduce, returns=False)),
    Rule("my_one_shot_all_reduce", "no torch.distributed call: the sum comes from the buffers", "2 ranks, five calls",
         V(my_one_shot_all_reduce, dist_all_reduce=True)),
    Rule("my_one_shot_all_reduce", "read every peer", "read all 3 peers", V(my_one_shot_all_reduce, peers_read=2)),
    Rule("dispatch_splits", "one split per rank, not per expert", "one pair each way",
         V(dispatch_splits, count="per expert")),
    Rule("dispatch_splits", "count pairs, not tokens", "count pairs, not tokens", V(dispatch_splits, count="tokens")),
    Rule("dispatch_splits", "count pairs on one rank too", "one rank holds every expert",
         V(dispatch_splits, count="tokens")),
    Rule("dispatch_splits", "contiguous blocks of experts, not e % N", "contiguous blocks, not e % N",
         V(dispatch_splits, placement="strided")),
    Rule("dispatch_splits", "a rank that receives nothing gets 0", "rank 1 receives nothing",
         V(dispatch_splits, every_rank=False)),
    Rule("dispatch_splits", "no tokens: N zeros", "no tokens", V(dispatch_splits, every_rank=False)),
    Rule("dispatch_splits", "rank 0 first", "one expert per rank, top-3", V(dispatch_splits, order="reversed")),
    Rule("dispatch_splits", "the forward runs with the split sizes", "on 2 ranks",
         V(dispatch_splits, placement="strided")),
    Rule("dispatch_splits", "a rank without tokens still joins with zero splits", "rank 1 without tokens",
         V(dispatch_splits, every_rank=False)),
]

SERVING_TRADEOFFS = [
    Rule("quantize_int4", "symmetric: scale = max|w| / 7", "symmetric: scale = max|w| / 7",
         V(quantize_int4, symmetric_steps=8)),
    Rule("quantize_int4", "round to the nearest code", "symmetric: scale = max|w| / 7",
         V(quantize_int4, rounding="floor")),
    Rule("quantize_int4", "asymmetric: scale = (hi - lo) / 15", "asymmetric: scale = (hi - lo) / 15",
         V(quantize_int4, asymmetric_steps=16)),
    Rule("quantize_int4", "the range widens to 0 (positive group)", "only positive weights",
         V(quantize_int4, widen_to_zero=False)),
    Rule("quantize_int4", "the range widens to 0 (negative group)", "only negative weights",
         V(quantize_int4, widen_to_zero=False)),
    Rule("quantize_int4", "one scale per group, not per row", "inflates only its own group's scale",
         V(quantize_int4, groups="per row")),
    Rule("quantize_int4", "per group, not per row, asymmetric", "an outlier, asymmetric",
         V(quantize_int4, groups="per row")),
    Rule("quantize_int4", "rows have their own scales", "groups run along each row",
         V(quantize_int4, groups="per tensor")),
    Rule("quantize_int4", "rows have their own scales, asymmetric", "rows of different sizes, asymmetric",
         V(quantize_int4, groups="per tensor")),
    Rule("quantize_int4", "an all-zero group gets scale 1", "an all-zero group gets scale 1",
         V(quantize_int4, zero_group_scale=0.0)),
    Rule("quantize_int4", "an all-zero group, asymmetric: scale 1", "an all-zero group, asymmetric",
         V(quantize_int4, zero_group_scale=0.0)),
    Rule("quantize_int4", "K not a multiple of the group: ValueError", "K = 96", V(quantize_int4, check_width=False)),
    Rule("quantize_int4", "K not a multiple of the group, asymmetric: ValueError", "K = 200",
         V(quantize_int4, check_width=False)),
    Rule("quantize_int4", "dequantize subtracts the zero point", "asymmetric: scale = (hi - lo) / 15",
         with_dequantize(subtract_zero=False)),
    Rule("quantize_int4", "symmetric codes are signed already", "symmetric: scale = max|w| / 7",
         with_dequantize(offset=8)),
    Rule("reload_or_recompute", "add the tier's latency", "4 tokens from an NVMe SSD",
         V(reload_or_recompute, latency="left out")),
    Rule("reload_or_recompute", "the latency once", "8 tokens from NVMe: just above the crossover",
         V(reload_or_recompute, latency="twice")),
    Rule("reload_or_recompute", "the latency once, over TCP", "11 tokens over TCP",
         V(reload_or_recompute, latency="twice")),
    Rule("reload_or_recompute", "decide on the times with latency", "7 tokens from NVMe: just below",
         V(reload_or_recompute, decide_by="copy time only")),
    Rule("reload_or_recompute", "decide on the times with latency, over TCP", "10 tokens over TCP",
         V(reload_or_recompute, decide_by="copy time only")),
    Rule("reload_or_recompute", "the faster way wins", "a link slower per token than the prefill",
         V(reload_or_recompute, decide_by="the slower wins")),
    Rule("reload_or_recompute", "a GB is 10^9 bytes", "10,000 tokens", V(reload_or_recompute, gb=2**30 / 1e9)),
    Rule("reload_or_recompute", "K and V", "10,000 tokens", V(reload_or_recompute, vectors=1)),
    Rule("reload_or_recompute", "the cache holds KV heads only", "10,000 tokens",
         V(reload_or_recompute, kv_heads="num_heads")),
    Rule("reload_or_recompute", "the model's own KV heads", "32 KV heads, no GQA",
         V(reload_or_recompute, kv_heads="Llama-3's 8")),
    Rule("reload_or_recompute", "recompute with the active parameters", "recomputes with its ACTIVE parameters",
         V(reload_or_recompute, params="all")),
    Rule("reload_or_recompute", "attention only when include_attention", "10,000 tokens",
         V(reload_or_recompute, attention="always counted")),
    Rule("reload_or_recompute", "attention grows quadratically", "with attention counted, recompute grows",
         V(reload_or_recompute, attention="left out")),
    Rule("reload_or_recompute", "attention counts on short prompts too", "with attention, a short prompt",
         V(reload_or_recompute, attention="left out")),
    Rule("reload_or_recompute", "causal attention: n(n+1)/2 pairs", "n(n+1)/2",
         V(reload_or_recompute, attention="n^2 / 2")),
    Rule("reload_or_recompute", "a tie goes to reload", "an exact tie", V(reload_or_recompute, tie="recompute")),
    Rule("best_scheme", "decode at batch 1 is memory-bound", "batch 1 is memory-bound",
         V(best_scheme, roofs=("compute",))),
    Rule("best_scheme", "at large batches the compute roof takes over", "batch 256 is compute-bound",
         V(best_scheme, roofs=("memory",))),
    Rule("best_scheme", "the best is the least step time: below the crossover, W4A16",
         "one below the crossover batch (160)", V(best_scheme, best_by="the fastest tensor cores")),
    Rule("best_scheme", "the best is the least step time: at the crossover, FP8-W8A8", "the crossover batch: FP8-W8A8",
         V(best_scheme, best_by="fewest bytes")),
    Rule("best_scheme", "each GPU has its own crossover (L4)", "L4: fp8 tensor cores at 300 GB/s, one below",
         V(best_scheme, best_by="the H100's crossover batch, 160")),
    Rule("best_scheme", "each GPU has its own crossover (B200)", "B200 at its crossover batch",
         V(best_scheme, best_by="the H100's crossover batch, 160")),
    Rule("best_scheme", "the crossover moves with the context", "short contexts: the 8B crosses over too",
         V(best_scheme, best_by="the H100's crossover batch, 160")),
    Rule("best_scheme", "W4A16 stores a 16-bit scale per 128 weights", "batch 1 is memory-bound",
         V(best_scheme, scale_bits=False)),
    Rule("best_scheme", "the KV cache is read for context + 1 and written for 1", "batch 256 is compute-bound",
         V(best_scheme, kv_tokens="context + 1")),
    Rule("best_scheme", "no fp8 tensor cores: FP8-W8A8 is None", "an A100 has no fp8 tensor cores",
         V(best_scheme, fp8_everywhere=True)),
    Rule("best_scheme", "a tie goes to the earlier scheme", "a tie goes to BF16", V(best_scheme, tie="later scheme")),
    Rule("best_scheme", "every sequence reads its KV", "every sequence's KV read", V(best_scheme, kv=False)),
    Rule("best_scheme", "attention on the bf16 roof in every scheme", "a compute-bound FP8-W8A8 step",
         V(best_scheme, attention_roof="the scheme's")),
    Rule("best_scheme", "every expert's weights are read", "a mixture of experts reads every expert",
         V(best_scheme, weight_params="active")),
    Rule("best_scheme", "add the per-step overhead", "A100, batch 1: W4A16", V(best_scheme, overhead_s=0.0)),
    Rule("best_scheme", "the shares of the peaks an engine reaches", "L4 at its crossover batch",
         V(best_scheme, efficiency=False)),
]

RULES = {"01_paging": PAGING, "02_batching": BATCHING, "03_scheduler": SCHEDULER, "04_roofline": ROOFLINE,
         "05_collectives": COLLECTIVES, "06_ring_vs_tree": RING_VS_TREE, "07_nccl_topology": NCCL_TOPOLOGY,
         "08_fused_tp": FUSED_TP, "09_serving_tradeoffs": SERVING_TRADEOFFS}

# Hand-built cases that illustrate a rule stated by another case (a data point, another model or
# GPU), with no rule of their own that a variant could break alone: (function, pattern of the why).
ILLUSTRATIONS = [
    ("kv_bytes_per_token", r" in fp(16|8)$"),   # every model in the course, in both dtypes
    ("kv_bytes_per_token", r"^MQA: one KV head$"),
    ("kv_blocks_available", r"^80 GiB at 0\.90$"),
    ("kv_blocks_available", r"^Llama-3\.1-8B on .* at 0\.\d$"),
    ("paged_waste_fraction", r"^a real paged allocator"),
    ("blocks_after_parallel_sampling", r"^one sample shares with nobody$"),
    ("static_steps", r"^two full batches$"),
    ("static_idle_slot_steps", r"^one 2000-token request"),
    ("my_assign_buckets", r"^a parameter larger than the cap in an empty bucket: alone$"),  # closes the bucket it joins
    ("install_bucketed_reducer", r"^a bucket per parameter$"),
    ("my_ring_all_reduce", r"^5 ranks, chunks of 5 and 4$"),
    ("quantize_int4", r"^one row, one group$"),
    ("reload_or_recompute", r"^10,100 tokens: |^the RDMA pool: |^CPU memory while offloads run: "),
    ("reload_or_recompute", r"^already in GPU memory: "),  # bytes / inf is 0 in every formulation of the rule
]


# ---------------------------------------------------------------------------------------------
# Judging, as the graders do

@functools.cache
def _task(function: str) -> tuple[str, Task]:
    for exercise in MODULES:
        for task in exercise_tasks(exercise):
            if task.function == function:
                return exercise, task
    raise KeyError(function)


@functools.cache
def _cases(function: str) -> tuple[list, list]:
    """The task's cases and their expected values, computed once."""
    task = _task(function)[1]
    cases = task.cases()
    return cases, expected_values(task, cases)


def graded(function: str, fn: Callable, case: str | None = None) -> TaskVerdict:
    """The grader's verdict on ``fn`` over the task's cases whose why contains ``case`` (all for None, the
    seeded random ones for RANDOM)."""
    task = _task(function)[1]
    cases, expected = _cases(function)
    chosen = [i for i, c in enumerate(cases) if case is None or (case in c.why if case else not c.why)]
    assert chosen, f"{function}: no hand-built case's why contains {case!r}"
    picked = [cases[i] for i in chosen]
    outcomes = run_cases(fn, task.call, plain_cases(picked), task.time_limit_s)
    return judge(task, picked, [expected[i] for i in chosen], outcomes)


def _tasks() -> list[tuple[str, Task]]:
    return [(exercise, task) for exercise in MODULES for task in exercise_tasks(exercise)]


CORRECT = {name: fn for name, fn in globals().items() if callable(fn) and name in {t.function for _, t in _tasks()}}


def _rows() -> list:
    rows = []
    for exercise, table in RULES.items():
        for row in table:
            marks = [pytest.mark.xfail(strict=True, reason=row.gap)] if row.gap else []
            rows.append(pytest.param(row, id=f"{exercise}:{row.function}:{row.rule}", marks=marks))
    return rows


@pytest.mark.parametrize("exercise, task", _tasks(), ids=lambda v: v if isinstance(v, str) else v.function)
def test_the_correct_function_passes(exercise, task):
    """The function every variant of the task perturbs passes all its cases, switches at their defaults."""
    verdict = graded(task.function, CORRECT[task.function])
    assert verdict.passed, "\n".join(verdict.report())


@pytest.mark.parametrize("exercise, task", [(e, t) for e, t in _tasks() if t.call == "direct"],
                         ids=lambda v: v if isinstance(v, str) else v.function)
def test_the_course_reference_passes_as_a_learner_would(exercise, task):
    """The course's own reference, called the way a learner's function is, passes the judge: the
    expected values survive the trip as plain data (a task called on ranks takes other arguments)."""
    verdict = graded(task.function, task.reference)
    assert verdict.passed, "\n".join(verdict.report())


@pytest.mark.parametrize("row", _rows())
def test_each_wrong_variant_fails_on_the_case_of_its_rule(row):
    verdict = graded(row.function, row.wrong, row.case)
    assert not verdict.passed, (f"{row.function} breaking {row.rule!r} passes "
                                + (f"the cases {row.case!r}" if row.case else "every case of its task"))
    if row.case is not None:
        assert all("no answer within" not in c.got for c in verdict.failures), "\n".join(verdict.report())


def test_every_task_has_wrong_variants():
    covered = {(exercise, row.function) for exercise, table in RULES.items() for row in table}
    missing = [f"{exercise} {task.function}" for exercise, task in _tasks() if (exercise, task.function) not in covered]
    assert not missing, f"tasks without wrong variants: {missing}"
    assert set(CORRECT) == {task.function for _, task in _tasks()}


def test_every_rule_case_has_a_wrong_variant():
    """Each hand-built case's why is the key of a variant, or an illustration of another case's rule."""
    keys = {}
    for table in RULES.values():
        for row in table:
            if row.case:  # neither a gap nor RANDOM
                keys.setdefault(row.function, []).append(row.case)
    unmatched = []
    for exercise, task in _tasks():
        for case in _cases(task.function)[0]:
            if not case.why or any(key in case.why for key in keys.get(task.function, [])):
                continue
            if any(function == task.function and re.search(pattern, case.why) for function, pattern in ILLUSTRATIONS):
                continue
            unmatched.append(f"{exercise} {task.function}: {case.why!r}")
    assert not unmatched, "hand-built cases with no wrong variant:\n" + "\n".join(sorted(set(unmatched)))
