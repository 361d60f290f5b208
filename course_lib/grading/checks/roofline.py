"""Exercise 04's tasks: a step's arithmetic intensity, greedy and random verification of drafts, the P:D ratio.

Expected values come from the course's roofline (``perf.roofline.step_cost`` against the peak roofs,
``AT_THE_ROOFS``, so the binding roof follows the peaks' ridge point), the engine's rejection sampler
(greedy verification), the exact output distribution of one rejection-sampling step (the learner's
sampler is run thousands of times and judged by a chi-square test), and ``perf.serving.pd_ratio``.
"""

from __future__ import annotations

import math
import random

import torch

from course_lib.engine.rejection_sampler import rejection_sample
from course_lib.engine.sampling_params import SamplingParams
from course_lib.grading.task import Case, Task
from course_lib.grading.values import Rule
from course_lib.perf.hardware import GPUS, get_gpu
from course_lib.perf.kv import model_kv_bytes_per_token
from course_lib.perf.models import MODELS, get_model
from course_lib.perf.roofline import AT_THE_ROOFS, ridge_point, step_cost
from course_lib.perf.serving import pd_ratio

DRAWS = 3000  # calls of the learner's sampler per case
SIGNIFICANCE = 1e-6  # a right sampler fails a case this rarely; the mistakes score far above the critical value


# Task 1

# A step whose intensity is the L4's ridge point exactly: 1,041,330,104,320 FLOPs over 2,581,810,176 bytes is
# 1210/3 FLOP/byte, as is 121e12 / 300e9. Every number is a whole one, so the usual ways of comparing (the two
# ratios, the two times, multiplied out, ridge x bytes, and the same in TFLOP, GFLOP, GB or TB) all give exactly
# equal sides (tests/grading/test_checks_boundaries.py computes each): the decision at the tie can be judged exactly.
TIE_AT_THE_RIDGE = [(1689, 381), (654, 1)]


def roofline_step(model_name: str, gpu_name: str, requests: list[tuple[int, int]]) -> dict:
    """FLOPs, bytes, arithmetic intensity and binding roof of one bf16 step, from ``step_cost``."""
    cost = step_cost(get_model(model_name), get_gpu(gpu_name), requests, "bf16", AT_THE_ROOFS)
    return {"flops": cost.flops, "bytes": cost.bytes, "intensity": cost.arithmetic_intensity, "bound": cost.bound}


def _intensity_cases() -> list[Case]:
    cases = [Case(("Llama-3.1-8B", "H100-80GB", [(0, 8192)]), why="a long prefill: compute-bound"),
             Case(("Llama-3.1-8B", "H100-80GB", [(1024, 1)]), why="a batch-1 decode: memory-bound"),
             Case(("Llama-3.1-8B", "H100-80GB", [(1024, 1)] * 256),
                  why="256 decodes share one weight read, but each reads its own KV: still memory-bound"),
             Case(("Llama-3.1-8B", "H100-80GB", [(128, 1)] * 512), why="512 short decodes cross the ridge point"),
             Case(("Mixtral-8x7B", "H200-141GB", [(512, 1)] * 64),
                  why="a mixture of experts: active parameters for FLOPs, every parameter for bytes"),
             Case(("Llama-3.1-8B", "H100-80GB", [(4096, 512)]),
                  why="a chunk after 4096 cached tokens: every new token attends them all"),
             Case(("Llama-3.1-8B", "H100-80GB", [(0, 2048), (1000, 1), (3000, 1), (500, 1)]),
                  why="a prefill and three decodes in one step"),
             Case(("Llama-3.1-8B", "A100-80GB", [(0, 256)]), why="the ridge point is the GPU's: A100, compute-bound"),
             Case(("Llama-3.1-8B", "H100-80GB", [(0, 256)]), why="the same step on an H100: memory-bound"),
             Case(("Llama-3.2-1B", "L4-24GB", TIE_AT_THE_RIDGE),
                  why="exactly at the L4's ridge point (in FLOPs and bytes, TFLOP and GB alike): at or above it is "
                      "'compute'"),
             Case(("Llama-3.2-1B", "L4-24GB", [(1689, 381), (655, 1)]),
                  why="one context token more than the tie: just below the ridge point, 'memory'")]
    rng = random.Random(41)
    while len(cases) < 40:
        requests = [(rng.choice([0, rng.randint(1, 8000)]), rng.choice([1, 1, rng.randint(1, 2048)]))
                    for _ in range(rng.randint(1, 64))]
        case = Case((rng.choice(sorted(MODELS)), rng.choice(sorted(GPUS)), requests))
        ridge = ridge_point(get_gpu(case.args[1]))
        if abs(roofline_step(*case.args)["intensity"] / ridge - 1) > 1e-6:  # never so near that rounding picks the roof
            cases.append(case)
    return cases


def step_variant(model_name: str, requests: list[tuple[int, int]], *, linear: float = 2, attention: float = 4,
                 query_heads: str = "num_heads", pairs: str = "causal", weights: str = "num_params",
                 weight_bytes: float = 2, kv_heads: str = "num_kv_heads", k_and_v: float = 2, kv_bytes: float = 2,
                 kv_tokens: str = "context and new") -> tuple[float, float]:
    """(FLOPs, bytes) of the task's formula with one part changed, to name a mistake by the value it gives."""
    model = get_model(model_name)
    new = sum(n for _, n in requests)
    counted = {"causal": lambda c, n: n * c + n * (n + 1) // 2,         # new token i attends c + i + 1
               "cached only": lambda c, n: n * c,                        # the new tokens attend nothing new
               "all new": lambda c, n: n * (c + n),                      # every new token attends every new one
               "not itself": lambda c, n: n * c + n * (n - 1) // 2,      # new token i attends c + i
               "from the start": lambda c, n: (c + n) * (c + n + 1) // 2}[pairs]  # the cached tokens again
    flops = (linear * (model.active_params if weights != "active in FLOPs" else model.num_params) * new
             + attention * model.num_layers * getattr(model, query_heads) * model.head_dim
             * sum(counted(c, n) for c, n in requests))
    per_token = k_and_v * model.num_layers * getattr(model, kv_heads) * model.head_dim * kv_bytes
    tokens = {"context and new": sum(c + 2 * n for c, n in requests), "context": sum(c + n for c, n in requests),
              "cached": sum(c for c, _ in requests), "none": 0}[kv_tokens]
    read = {"num_params": model.num_params, "active in FLOPs": model.num_params, "active_params": model.active_params}
    return flops, weight_bytes * read[weights] + per_token * tokens


# (a part of the formula changed, what the hint says), for the FLOPs and for the bytes
FLOP_MISTAKES = (
    ({"attention": 0}, "add attention's FLOPs: 4 x layers x query heads x head_dim x attended pairs"),
    ({"weights": "active in FLOPs"},
     "a token multiplies only by its own experts' weights: 2 x ACTIVE parameters per new token"),
    ({"query_heads": "num_kv_heads"},
     "attention's FLOPs count the query heads, model.num_heads: every query head attends; the KV heads "
     "(num_kv_heads, fewer with GQA) count only in the KV cache's bytes"),
    ({"linear": 1}, "a multiply-add is 2 FLOPs: the linear layers do 2 x active_params FLOPs per new token"),
    ({"attention": 2}, "attention has two matrix products (QK^T and PV), each a multiply-add (2 FLOPs) per pair "
                       "and per head_dim: 4 x layers x num_heads x head_dim per attended pair"),
    ({"pairs": "cached only"}, "attended pairs: the new tokens also attend each other and themselves; new token i "
                               "(from 0) attends cached_tokens + i + 1 tokens, new x cached + new x (new + 1) / 2"),
    ({"pairs": "all new"}, "attended pairs: attention is causal, new token i (from 0) attends cached_tokens + i + 1 "
                           "tokens, not every new one: new x cached + new x (new + 1) / 2"),
    ({"pairs": "not itself"}, "attended pairs: a token attends itself too, new token i (from 0) attends "
                              "cached_tokens + i + 1 tokens: new x cached + new x (new + 1) / 2"),
    ({"pairs": "from the start"}, "attended pairs: only the new tokens are computed in this step (the cached ones "
                                  "attended earlier): new x cached + new x (new + 1) / 2"),
)
BYTE_MISTAKES = (
    ({"weights": "active_params"}, "a step of many tokens reads every expert's weights: 2 bytes x ALL parameters"),
    ({"kv_tokens": "none"}, "add the KV cache: read for every context token, written for every new one"),
    ({"kv_heads": "num_heads"}, "the KV cache holds the KV heads only: model.num_kv_heads, not num_heads (with GQA "
                                "several query heads share one KV head)"),
    ({"k_and_v": 1}, "half the KV bytes: a token stores a key AND a value, each of 2 bytes a number (bf16): KV "
                     "bytes per token = 2 x layers x KV heads x head_dim x 2 bytes"),  # either factor missing
    ({"weight_bytes": 1}, "the weights are bf16: 2 bytes x num_params"),
    ({"kv_tokens": "context"}, "the new tokens' keys and values are also written once: KV bytes per token x "
                               "(context tokens + new tokens)"),
    ({"kv_tokens": "cached"}, "the KV cache is read for every context token (cached + new) and written for every "
                              "new one: KV bytes per token x (cached + 2 x new)"),
)


def _nearest(value: float, variants: list[tuple[float, str]]) -> str | None:
    """The hint of the variant nearest ``value``, if it is within 1e-6 of it (relative): the mistake made."""
    distance = lambda variant: abs(value - variant) / max(abs(variant), 1e-300)  # noqa: E731
    near = [(distance(variant), hint) for variant, hint in variants if distance(variant) <= 1e-6]
    return min(near)[1] if near else None


def _intensity_hint(case: Case, expected, got) -> str | None:
    model_name, gpu_name, requests = case.args
    if not isinstance(got, dict) or set(got) != set(expected):
        return "return a dict with the keys 'flops', 'bytes', 'intensity' and 'bound'"
    close = lambda value, target: math.isclose(value, target, rel_tol=1e-6)  # noqa: E731
    if not close(got["flops"], expected["flops"]):
        named = _nearest(got["flops"], [(step_variant(model_name, requests, **change)[0], hint)
                                        for change, hint in FLOP_MISTAKES])
        return named or ("FLOPs = 2 x active_params x new tokens + 4 x layers x num_heads x head_dim x attended pairs, "
                "new token i (from 0) attending cached_tokens + i + 1 tokens")
    if not close(got["bytes"], expected["bytes"]):
        named = _nearest(got["bytes"], [(step_variant(model_name, requests, **change)[1], hint)
                                        for change, hint in BYTE_MISTAKES])
        return named or ("bytes = 2 x num_params + KV bytes per token x (cached + 2 x new), KV bytes per token = 2 (K and V) "
                "x layers x num_kv_heads x head_dim x 2 bytes")
    if not close(got["intensity"], expected["intensity"]):
        return "intensity is FLOPs per byte: flops / bytes"
    if got["bound"] != expected["bound"]:
        gpu = get_gpu(gpu_name)
        if expected["flops"] * gpu.hbm_bandwidth == gpu.bf16_flops * expected["bytes"]:
            return ("this step sits exactly on the ridge point: at or above it is 'compute' (>=, not >); the case is "
                    "exact in FLOPs and bytes as in TFLOP and GB")
        return "compare the intensity with the GPU's ridge point, bf16_flops / hbm_bandwidth: at or above it, 'compute'"
    return None


def _describe_step(case: Case) -> str:
    """The call, with a batch of equal requests written as ``[(1024, 1)] * 256``."""
    model_name, gpu_name, requests = case.args
    shown = f"[{requests[0]}] * {len(requests)}" if len(requests) > 1 and len(set(requests)) == 1 else repr(requests)
    text = f"step_intensity({model_name!r}, {gpu_name!r}, {shown})"
    return text if len(text) <= 240 else text[:237] + "..."


# Task 2

def engine_greedy_verify(draft_token_ids: list[int], target_argmax_ids: list[int]) -> list[int]:
    """The tokens the engine's rejection sampler emits for greedy requests, the target's scores
    being one-hot on ``target_argmax_ids``."""
    logits = torch.zeros(len(target_argmax_ids), max(draft_token_ids + target_argmax_ids) + 1)
    logits[range(len(target_argmax_ids)), target_argmax_ids] = 1.0
    return rejection_sample(logits, list(draft_token_ids), None, SamplingParams(temperature=0))[0]


def _greedy_cases() -> list[Case]:
    cases = [Case(([5, 8, 2], [5, 8, 2, 9]), why="every draft matches: all kept, plus the bonus token"),
             Case(([4, 8, 2], [5, 8, 2, 9]), why="the first draft is wrong: only the target's token"),
             Case(([5, 8, 3, 1], [5, 8, 2, 1, 6]), why="a mismatch in the middle: the target's token replaces it"),
             Case(([3, 9, 5, 7], [3, 4, 5, 7, 1]), why="a draft that matches after a mismatch does not count"),
             Case(([], [6]), why="no drafts: the target's token alone"),
             Case(([7, 7, 7, 7], [7, 7, 7, 2, 7]), why="repeated tokens")]
    rng = random.Random(42)
    for _ in range(40):
        target = [rng.randrange(8) for _ in range(rng.randint(1, 9))]
        drafts = [t if rng.random() < 0.85 else rng.randrange(8) for t in target[:-1]]
        cases.append(Case((drafts, target)))
    return cases


def _greedy_hint(case: Case, expected, got) -> str | None:
    drafts = case.args[0]
    if not isinstance(got, (list, tuple)):
        return "return the emitted tokens as a list"
    got = list(got)
    if got == expected[:-1]:
        return ("the target always adds one token: its argmax at the first mismatch, or the bonus "
                "target_argmax_ids[-1] when every draft matches")
    if len(got) > len(expected) and got[:len(expected) - 1] == expected[:-1]:
        return "stop at the first mismatch: a later draft was proposed after a wrong token, so it cannot be kept"
    if len(got) == len(expected) and got[:-1] == expected[:-1] and got[-1] == drafts[len(expected) - 1]:
        return "at the first mismatch emit the target's token, not the rejected draft"
    return None


# Task 3

def rejection_shares(target_probs: list[float], draft_probs: list[float], draft_token: int, *, draws: int,
                     seed: int) -> list[float]:
    """The exact distribution of the token one rejection-sampling step emits: the draft ``x`` with
    probability a = min(1, p(x) / q(x)), any token y with (1 - a) x max(0, p(y) - q(y)) normalised.
    (``draws`` and ``seed`` say how the learner's sampler is run; they do not change the answer.)"""
    p, q, x = target_probs, draft_probs, draft_token
    accept = min(1.0, p[x] / q[x])
    shares = [0.0] * len(p)
    if accept < 1:
        residual = [max(0.0, p_y - q_y) for p_y, q_y in zip(p, q)]
        shares = [(1 - accept) * r / sum(residual) for r in residual]
    shares[x] += accept
    return shares


def _draws_case(p: list[float], q: list[float], x: int, seed: int, why: str = "") -> Case:
    return Case((p, q, x), dict(draws=DRAWS, seed=seed), why=why)


def _random_probs(rng: random.Random, size: int) -> list[float]:
    weights = [math.exp(rng.gauss(0, 1)) for _ in range(size)]
    return [w / sum(weights) for w in weights]


def _rejection_cases() -> list[Case]:
    cases = [_draws_case([0.3, 0.1, 0.2, 0.2, 0.2], [0.2, 0.4, 0.15, 0.1, 0.15], 1, 1,
                         why="p(x) < q(x): accepted with probability p(x)/q(x), else a token from max(0, p - q)"),
             _draws_case([0.1, 0.5, 0.2, 0.1, 0.1], [0.2, 0.3, 0.1, 0.3, 0.1], 1, 2,
                         why="p(x) >= q(x): always accepted"),
             _draws_case([0.5, 0.0, 0.25, 0.25, 0.0], [0.25, 0.25, 0.25, 0.125, 0.125], 1, 3,
                         why="p(x) = 0: always rejected"),
             _draws_case([0.2, 0.3, 0.1, 0.25, 0.15], [0.0, 0.0, 1.0, 0.0, 0.0], 2, 4,
                         why="q a point mass on x (n-gram drafts): accepted with p(x), else p without x"),
             _draws_case([0.05, 0.15, 0.4, 0.3, 0.1], [0.3, 0.3, 0.1, 0.1, 0.2], 0, 5,
                         why="tokens where p < q are never emitted"),
             _draws_case([0.1, 0.2, 0.3, 0.25, 0.15], [0.1, 0.2, 0.3, 0.25, 0.15], 3, 6,
                         why="p == q: always accepted")]
    rng = random.Random(43)
    while len(cases) < 12:
        size = rng.randint(3, 8)
        p, q = _random_probs(rng, size), _random_probs(rng, size)
        x = rng.choices(range(size), weights=q)[0]
        shares = rejection_shares(p, q, x, draws=DRAWS, seed=0)
        if all(share == 0 or share * DRAWS >= 10 for share in shares):  # enough expected draws of each token
            cases.append(_draws_case(p, q, x, len(cases) + 1))
    return cases


def _rejection_hint(case: Case, expected, got) -> str | None:
    x, draws = case.args[2], sum(got)
    if expected[x] == 1:
        return "here p(x) >= q(x), so min(1, p(x) / q(x)) = 1: the draft is always accepted"
    if expected[x] == 0 and got[x]:
        return "here p(x) = 0, so min(1, p(x) / q(x)) = 0: the draft is never accepted"
    if any(count and share == 0 for count, share in zip(got, expected)):
        return "after a rejection, sample max(0, p - q) normalised: a token where p <= q never comes out"
    share = got[x] / draws
    if abs(share - expected[x]) > 4 * math.sqrt(expected[x] * (1 - expected[x]) / draws):
        return (f"the draft came back {share:.3f} of the time, not {expected[x]:.3f}: it is accepted with "
                "probability min(1, p(x) / q(x)), and a rejection never returns it (max(0, p - q) is 0 there)")
    return "after a rejection, sample max(0, p - q) normalised"


def _describe_draws(case: Case) -> str:
    p, q, x = case.args
    rounded = lambda values: "[" + ", ".join(f"{v:.3g}" for v in values) + "]"  # noqa: E731
    return (f"rejection_step(target_probs={rounded(p)}, draft_probs={rounded(q)}, draft_token={x}, generator) "
            f"× {case.kwargs['draws']} calls")


# Task 4

def engine_pd_ratio(num_seqs: int, tpot_s: float, output_len: int, prefill_requests_per_s: float) -> dict:
    """``pd_ratio``'s rates and ratio, as the task returns them."""
    ratio = pd_ratio(num_seqs, tpot_s, output_len, prefill_requests_per_s)
    return {"decode_tokens_per_s": ratio.decode_tokens_per_s, "decode_requests_per_s": ratio.decode_requests_per_s,
            "prefill_per_decode": ratio.prefill_per_decode}


def _ratio_cases() -> list[Case]:
    cases = [Case((256, 0.040, 500, 10.0), why="256 sequences at 40 ms, 500 tokens each, 10 prefills/s: 1.28"),
             Case((256, 0.040, 1000, 10.0), why="outputs twice as long: half the requests, half the prefill"),
             Case((256, 0.040, 500, 20.0), why="a prefill instance twice as fast: half as many"),
             Case((64, 0.020, 1000, 20.0), why="fewer than one prefill instance per decode instance")]
    rng = random.Random(44)
    for _ in range(30):
        cases.append(Case((rng.randint(1, 512), rng.uniform(0.005, 0.1), rng.randint(1, 4000), rng.uniform(0.5, 50))))
    return cases


def _ratio_hint(case: Case, expected, got) -> str | None:
    if not isinstance(got, dict) or set(got) != set(expected):
        return "return a dict with the keys 'decode_tokens_per_s', 'decode_requests_per_s' and 'prefill_per_decode'"
    close = lambda value, target: math.isclose(value, target, rel_tol=1e-6)  # noqa: E731
    if not close(got["decode_tokens_per_s"], expected["decode_tokens_per_s"]):
        return "each of num_seqs sequences emits one token every tpot_s seconds: num_seqs / tpot_s"
    if not close(got["decode_requests_per_s"], expected["decode_requests_per_s"]):
        return "a request is done after output_len tokens: divide the tokens per second by output_len"
    if close(got["prefill_per_decode"], 1 / expected["prefill_per_decode"]):
        return "upside down: the decode instance's requests per second over one prefill instance's"
    return None


TASKS = (
    Task(1, "Arithmetic intensity and the binding roof", "step_intensity", _intensity_cases, roofline_step,
         hint=_intensity_hint, describe=_describe_step, examples=2),
    Task(2, "Greedy verification", "verify_greedy", _greedy_cases, engine_greedy_verify, hint=_greedy_hint,
         examples=3),
    Task(3, "One rejection-sampling step", "rejection_step", _rejection_cases, rejection_shares,
         rule=Rule(significance=SIGNIFICANCE, draws=DRAWS), hint=_rejection_hint, call="repeated_draws",
         describe=_describe_draws, examples=1),
    Task(4, "The P:D ratio", "prefill_per_decode", _ratio_cases, engine_pd_ratio, hint=_ratio_hint, examples=1),
)
