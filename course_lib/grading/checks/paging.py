"""Exercise 01's tasks: KV bytes per token, the start-up block budget, paging's waste, parallel sampling."""

from __future__ import annotations

import math

from course_lib.grading.task import Case, Task
from course_lib.paging.block_table import parallel_sampling_report
from course_lib.paging.paged import PagedAllocator
from course_lib.paging.report import measure
from course_lib.perf.hardware import GPUS
from course_lib.perf.kv import dtype_bytes, kv_bytes_per_token, split_memory, whole_blocks
from course_lib.perf.models import MODELS, get_model
from course_lib.perf.units import GiB

BLOCK_8B = 16 * 131072  # 16 tokens of Llama-3.1-8B's KV in bf16


def _bytes_cases() -> list[Case]:
    cases = [Case((32, 8, 128, 2), why="Llama-3-8B in fp16: GQA, 8 KV heads"),
             Case((32, 32, 128, 2), why="Llama-2-7B in fp16: MHA, a KV head per query head"),
             Case((32, 1, 128, 2), why="MQA: one KV head"),
             Case((32, 8, 128, 1), why="fp8: one byte per element")]
    for spec in MODELS.values():
        for dtype in ("fp16", "fp8"):
            cases.append(Case((spec.num_layers, spec.num_kv_heads, spec.head_dim, int(dtype_bytes(dtype))),
                              why=f"{spec.name} in {dtype}"))
    return cases


def _bytes_hint(case: Case, expected, got) -> str | None:
    num_layers, num_kv_heads, head_dim, dtype_bytes = case.args
    if got == expected / 2 and dtype_bytes == 2:  # a missing factor 2, K and V or the 2 bytes: the same value
        return ("that is half: every token stores a key AND a value vector per layer and KV head, each head_dim "
                "elements of dtype_bytes (here 2) bytes: one of the two factors 2 is missing")
    if got == expected / 2:
        return "that is half: every token stores a key AND a value vector per layer and KV head"
    if got == expected * num_layers or got * num_layers == expected:
        return "check the number of layers: every layer stores its own keys and values"
    if got == expected * 8 or got * 8 == expected:
        return "bytes, not bits: dtype_bytes is already in bytes"
    return "2 (K and V) x num_layers x num_kv_heads x head_dim x dtype_bytes"


def _blocks_cases() -> list[Case]:
    cases = [Case((40 * GiB, 0.30, 16.06e9, 1 * GiB, BLOCK_8B),
                  why="40 GiB at 0.30: weights and activations exceed the budget, so 0 blocks, never negative"),
             Case((80 * GiB, 0.30, 16.06e9, 1 * GiB, BLOCK_8B), why="80 GiB at 0.30"),
             Case((80 * GiB, 0.90, 16.06e9, 1 * GiB, BLOCK_8B), why="80 GiB at 0.90"),
             Case((1000, 1.0, 100, 100, 200), why="exactly 4 blocks are left"),
             Case((1000, 1.0, 100, 101, 200), why="one byte short of 4 blocks: whole blocks only"),
             Case((1000, 0.5, 300, 200, 200), why="nothing left at all: 0")]
    for gpu in GPUS.values():
        for utilization in (0.3, 0.5, 0.7, 0.9):
            plan = split_memory(get_model("Llama-3.1-8B"), gpu, gpu_memory_utilization=utilization)
            cases.append(Case((gpu.memory_bytes, utilization, plan.weight_bytes, plan.activation_reserve_bytes,
                               plan.block_bytes), why=f"Llama-3.1-8B on {gpu.name} at {utilization}"))
    return cases


def _blocks_reference(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes) -> int:
    return whole_blocks(gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes, block_bytes)


def _blocks_hint(case: Case, expected, got) -> str | None:
    memory, utilization, weights, activations, block = case.args
    if got < 0:
        return "never negative: when nothing is left, return 0"
    left = utilization * memory - weights - activations
    variants = (((math.ceil(left / block), round(left / block)), "only whole blocks fit, so round down"),
                (((memory - weights - activations) // block,), "the server may use only gpu_memory_utilization x "
                 "gpu_memory_bytes: multiply before subtracting"),
                (((utilization * memory - activations) // block,), "subtract the weights too"),
                (((utilization * memory - weights) // block,), "subtract the activation peak too"),
                (((utilization * memory) // block,), "subtract the weights and the activation peak from the "
                 "server's share before counting blocks"))
    named = [hint for values, hint in variants if any(v != expected and got == max(0, v) for v in values)]
    if named:  # mistakes that give the same value here are all named
        return "; or ".join(named)
    return "whole blocks of gpu_memory_utilization x gpu_memory_bytes - weight_bytes - activation_bytes, at least 0"


def _waste_cases() -> list[Case]:
    cases = [Case(([100, 17, 16], 16), why="100, 17 and 16 tokens in 16-token blocks"),
             Case(([1], 16), why="one token in a 16-token block"),
             Case(([3, 250, 511], 1), why="1-token blocks waste nothing"),
             Case(([16, 32, 64], 16), why="lengths that fill their blocks exactly waste nothing")]
    for block_size in (1, 8, 16, 32):
        cases.append(Case(([3, 16, 17, 250, 511, 1000], block_size), why=f"a real paged allocator, block size {block_size}"))
    return cases


def paged_waste(lengths: list[int], block_size: int) -> float:
    """The empty share of the slots a real paged allocator holds for ``lengths``."""
    pool = PagedAllocator(num_blocks=sum(-(-n // block_size) for n in lengths), block_size=block_size,
                          max_model_len=max(lengths))
    for i, n in enumerate(lengths):
        pool.admit(f"r{i}", n)
    return measure(pool, {f"r{i}": n for i, n in enumerate(lengths)}).waste_fraction


def _waste_hint(case: Case, expected, got) -> str | None:
    lengths, block_size = case.args
    held = sum(-(-n // block_size) * block_size for n in lengths)
    if not 0 <= got <= 1:
        return "a fraction of the held slots: between 0 and 1"
    if expected and abs(got - (held - sum(lengths)) / sum(lengths)) < 1e-12:
        return "divide by the slots held, not by the tokens stored"
    return None


def _sharing_cases() -> list[Case]:
    cases = [Case((512, 4, 128, 16), why="a 512-token prompt, 4 samples of 128 tokens"),
             Case((40, 4, 12, 16), why="a partly filled last prompt block, copied once per sample"),
             Case((32, 3, 5, 16), why="a prompt of whole blocks: nothing to copy"),
             Case((40, 1, 12, 16), why="one sample shares with nobody"),
             Case((40, 2, 8, 16), why="outputs that end exactly on a block boundary")]
    for prompt_len in (1, 15, 16, 17, 40, 100, 512):
        for num_samples in (1, 2, 4, 8):
            for output_len in (1, 7, 16, 33):
                cases.append(Case((prompt_len, num_samples, output_len, 16)))
    return cases


def _sharing_hint(case: Case, expected, got) -> str | None:
    prompt_len, num_samples, output_len, block_size = case.args
    if got == num_samples * -(-(prompt_len + output_len) // block_size):
        return "the prompt's full blocks are shared by every sample, not copied"
    if got == -(-prompt_len // block_size) + num_samples * (-(-(prompt_len + output_len) // block_size)
                                                             - -(-prompt_len // block_size)):
        return "a partly filled last prompt block is copied by each sample that writes into it"
    return None


def _bytes_reference(num_layers, num_kv_heads, head_dim, bytes_per_element) -> int:
    return int(kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_element))  # whole bytes here


TASKS = (
    Task(1, "Bytes per token", "kv_bytes_per_token", _bytes_cases, _bytes_reference, hint=_bytes_hint),
    Task(2, "How many KV blocks does the server get?", "kv_blocks_available", _blocks_cases, _blocks_reference,
         hint=_blocks_hint, examples=3),
    Task(3, "What does paging still waste?", "paged_waste_fraction", _waste_cases, paged_waste, hint=_waste_hint),
    Task(4, "Blocks in use after parallel sampling", "blocks_after_parallel_sampling", _sharing_cases,
         lambda *args: parallel_sampling_report(*args).shared_blocks, hint=_sharing_hint),
)
