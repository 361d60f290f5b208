"""Exercise 09's tasks: group-wise int4 quantization and its inverse, reload or recompute a prefix's
KV cache, and the fastest weight scheme for a decode step.

Expected values come from ``quant.int4`` (``quantize_int4``, ``dequantize_int4``; the packing into
nibbles is the library's storage detail, so the learner's codes are compared as integers, signed
-8..7 when symmetric and unsigned 0..15 with a zero point otherwise), ``perf.kv_tiers``
(``reload_time``, ``recompute_time`` and the winner rule of ``ReloadOrRecompute``) and
``perf.quant_cost`` (``best_scheme``, ``decode_step_time``, ``scheme_available``,
``crossover_batch`` for the cases around the crossover).

The three call kinds join ``calls.CALLS`` when this module is imported, as it is in the
learner's process by the set-up cell's ``Checker("09_serving_tradeoffs")``:

  int4_round_trip  args ``(rows, cols, group_size, symmetric, kind, seed)``: builds the weight
                   (``case_weight``), calls ``codes, scales, zeros = fn(weight, group_size, symmetric)``
                   and the learner's ``dequantize_int4`` (found beside ``fn``) on those, and on the
                   course's own codes, and returns ``{"codes", "scales", "zeros", "round trip",
                   "dequantized from the course's codes"}``; for a width that is not a multiple of the
                   group, ``"raises ValueError"`` when ``fn`` raised one, else ``"no error"``
  kv_reload        args ``(model name, tokens, tier, flops, include_attention)``, the tier a preset's
                   name or ``[name, bandwidth, latency_s]``: ``fn(ModelSpec, tokens, KVTier, flops,
                   include_attention=...)``
  quant_scheme     args ``(model name, gpu name, batch, context_len)``: ``fn(ModelSpec, GPU, batch, context_len)``

Weights are random but never put an element within ``TIE_MARGIN`` of a rounding tie (``w / scale``
at k + 1/2, or a zero point ``-lo / scale`` there), so float32 and float64 implementations, dividing
or multiplying by a reciprocal, all round every element the same way. Random cases of Tasks 2 and 3
are likewise kept clear of ties between the two times or schemes.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from typing import Any, Callable

import torch

from course_lib.grading import calls
from course_lib.grading.task import Case, Task
from course_lib.grading.values import Rule, from_plain, to_plain
from course_lib.perf.hardware import GPUS, get_gpu
from course_lib.perf.kv import model_kv_bytes_per_token
from course_lib.perf.kv_tiers import (CPU_DRAM, CPU_DRAM_BUSY, GPU_HBM, LOCAL_NVME, POOL_RDMA, POOL_TCP,
                                      KVTier, ReloadOrRecompute, crossover_tokens, get_tier, recompute_time,
                                      reload_time)
from course_lib.perf.models import get_model
from course_lib.perf.quant_cost import (SCHEMES, best_scheme, crossover_batch, decode_step_time, scheme_available)
from course_lib.perf.roofline import Efficiency
from course_lib.quant import int4

OTHER_SEED = 1000  # the course's codes handed to the learner's dequantize_int4 are of the weight of seed + this
TIE_MARGIN = 2e-3  # no w / scale (or zero point) this close to k + 1/2
FLOAT32 = Rule(rel_tol=1e-5, abs_tol=1e-8)  # weights are ~1e-2: a quantization step is ~1e-3
TIMES = Rule(rel_tol=1e-6, abs_tol=1e-12)
REFERENCE_GPU = get_gpu("H100-80GB")  # recompute_time's gpu, unused when flops is given
MODEL_NAMES = ("Llama-3.1-8B", "Llama-3.2-1B", "Llama-3.1-70B", "Qwen2.5-7B", "Mixtral-8x7B", "Llama-2-7B")
GiB_PER_GB = 2**30 / 1e9


def _close(a: Any, b: Any, rel: float = 1e-6) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)
    except (TypeError, ValueError):
        return False


# Task 1 · group-wise int4

KINDS = {"normal": "random", "positive": "group 0 of each row all positive", "negative": "group 0 of each row all "
         "negative", "zeros": "group 1 of each row all zero", "outlier": "one outlier in row 0, group 0",
         "rows apart": "rows 1000x apart in size"}


def _near_tie(x: torch.Tensor) -> torch.Tensor:
    return (x - torch.floor(x) - 0.5).abs() < TIE_MARGIN


def _tie_elements(w: torch.Tensor, group_size: int, symmetric: bool) -> torch.Tensor:
    """A mask of the elements to nudge: those near a rounding tie, and the minimum of each group
    whose zero point is near one."""
    n, k = w.shape
    g = w.double().reshape(n, k // group_size, group_size)
    if symmetric:
        scale = g.abs().amax(dim=-1) / 7
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        bad = _near_tie(g / scale[..., None])
    else:
        lo, hi = g.amin(dim=-1).clamp(max=0), g.amax(dim=-1).clamp(min=0)
        scale = (hi - lo) / 15
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        bad = _near_tie(g / scale[..., None])
        bad |= _near_tie(-lo / scale)[..., None] & (g == g.amin(dim=-1, keepdim=True))
    return bad.reshape(n, k)


@functools.lru_cache(maxsize=128)
def _case_weight(rows: int, cols: int, group_size: int, symmetric: bool, kind: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    size = 0.02 * torch.exp(0.5 * torch.randn(rows, 1, generator=generator, dtype=torch.float64))
    if kind == "rows apart":
        size = 0.02 * torch.logspace(0, -3, rows, dtype=torch.float64)[:, None]
    w = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * size
    g = min(group_size, cols)
    if kind == "positive":
        w[:, :g] = w[:, :g].abs() + 1e-3
    elif kind == "negative":
        w[:, :g] = -w[:, :g].abs() - 1e-3
    elif kind == "zeros":
        w[:, g:2 * g] = 0.0
    elif kind == "outlier":
        w[0, 3] = 40 * size[0, 0]
    w = w.float()
    if cols % group_size == 0:
        for _ in range(200):
            bad = _tie_elements(w, group_size, symmetric)
            if not bad.any():
                break
            nudge = 1 + 0.02 * torch.rand(w.shape, generator=generator)  # the max and min of a group apart
            w = torch.where(bad, w * nudge.float(), w)
        else:
            raise RuntimeError("could not keep the weight clear of rounding ties")
    return w


def case_weight(rows: int, cols: int, group_size: int, symmetric: bool, kind: str, seed: int) -> torch.Tensor:
    """The float32 ``[rows, cols]`` weight of a Task 1 case (a fresh copy)."""
    return _case_weight(rows, cols, group_size, symmetric, kind, seed).clone()


def course_int4(weight: torch.Tensor, group_size: int, symmetric: bool):
    """``quant.int4``'s codes (signed -8..7 when symmetric, unsigned 0..15 otherwise, int64), scales
    (float32) and zeros (int64, or None), unpacked from its nibbles, and its dequantized weight."""
    q = int4.quantize_int4(weight, group_size, symmetric)
    unsigned = int4.unpack_int4(q.packed).to(torch.int64)
    codes = unsigned - 8 if symmetric else unsigned
    zeros = None if symmetric else q.zeros.to(torch.int64)
    return codes, q.scales, zeros, int4.dequantize_int4(q)


def other_codes(rows: int, cols: int, group_size: int, symmetric: bool, kind: str, seed: int) -> list:
    """The course's (codes, scales, zeros) as plain lists for a second weight of a case's shape: sent to the
    learner's process as case data, so no code running there (patched or not) can choose them."""
    codes, scales, zeros, _ = course_int4(case_weight(rows, cols, group_size, symmetric, kind, seed + OTHER_SEED),
                                          group_size, symmetric)
    return [codes.tolist(), scales.tolist(), None if zeros is None else zeros.tolist()]


def int4_expected(rows: int, cols: int, group_size: int, symmetric: bool, kind: str, seed: int,
                  course_codes: list | None = None) -> Any:
    if cols % group_size:
        return "raises ValueError"
    codes, scales, zeros, dequantized = course_int4(case_weight(rows, cols, group_size, symmetric, kind, seed),
                                                    group_size, symmetric)
    other = course_int4(case_weight(rows, cols, group_size, symmetric, kind, seed + OTHER_SEED), group_size, symmetric)
    return {"codes": codes.tolist(), "scales": scales.tolist(), "zeros": None if zeros is None else zeros.tolist(),
            "round trip": dequantized.tolist(), "dequantized from the course's codes": other[3].tolist()}


def _three(result: Any) -> tuple:
    if isinstance(result, (tuple, list)) and len(result) == 3:
        return tuple(result)
    raise TypeError(f"quantize_int4 returned {type(result).__name__}, not a tuple (codes, scales, zeros): return "
                    "all three, zeros None when symmetric")


def _dequantizer(quantize: Callable) -> Callable:
    found = getattr(inspect.unwrap(quantize), "__globals__", {}).get("dequantize_int4")  # unwrap: @torch.no_grad()
    if not callable(found):
        raise NameError("dequantize_int4 is not defined: write dequantize_int4(codes, scales, zeros, group_size) "
                        "in the same cell as quantize_int4, and run that cell")
    return found


def _int4_call(quantize: Callable, rows: int, cols: int, group_size: int, symmetric: bool, kind: str,
               seed: int, course_codes: list | None = None) -> Any:
    weight = case_weight(rows, cols, group_size, symmetric, kind, seed)
    if cols % group_size:
        try:
            quantize(weight, group_size, symmetric)
        except ValueError:
            return "raises ValueError"
        return "no error"
    dequantize = _dequantizer(quantize)
    codes, scales, zeros = _three(quantize(weight, group_size, symmetric))
    round_trip = dequantize(codes, scales, zeros, group_size)
    # the course's codes of another weight (case data, made in the grader's process): not the weight just quantized
    ours, our_scales, our_zeros = course_codes
    ours, our_scales = torch.tensor(ours, dtype=torch.int64), torch.tensor(our_scales, dtype=torch.float32)
    our_zeros = None if our_zeros is None else torch.tensor(our_zeros, dtype=torch.int64)
    return {"codes": codes, "scales": scales, "zeros": zeros, "round trip": round_trip,
            "dequantized from the course's codes": dequantize(ours, our_scales, our_zeros, group_size)}


def _int4_cases() -> list[Case]:
    def case(rows, cols, group_size, symmetric, kind, seed, why=""):
        args = (rows, cols, group_size, symmetric, kind, seed)
        codes = None if cols % group_size else other_codes(*args)
        return Case(args, {"course_codes": codes}, why=why)

    cases = [
        case(4, 64, 32, True, "normal", 1, "symmetric: scale = max|w| / 7 per group of 32, codes round(w / scale)"),
        case(4, 64, 32, False, "normal", 2,
             "asymmetric: scale = (hi - lo) / 15, zero = round(-lo / scale), codes round(w / scale) + zero"),
        case(4, 128, 32, False, "positive", 3, "a group of only positive weights: its range widens to 0, so zero = 0"),
        case(4, 128, 32, False, "negative", 4, "a group of only negative weights: its range widens to 0, zero = 15"),
        case(4, 256, 64, True, "outlier", 5, "an outlier inflates only its own group's scale: one scale per group"),
        case(4, 256, 64, False, "outlier", 6, "an outlier, asymmetric: per group, not per row or per tensor"),
        case(3, 128, 64, True, "zeros", 7, "an all-zero group gets scale 1 and codes 0"),
        case(3, 128, 64, False, "zeros", 8, "an all-zero group, asymmetric: scale 1, zero 0, codes 0"),
        case(6, 256, 128, True, "rows apart", 9, "groups run along each row: rows of different sizes, own scales"),
        case(6, 256, 128, False, "rows apart", 10, "rows of different sizes, asymmetric"),
        case(1, 32, 32, True, "normal", 11, "one row, one group"),
        case(2, 96, 64, True, "normal", 12, "K = 96 is not a multiple of 64: raise ValueError"),
        case(2, 200, 128, False, "normal", 13, "K = 200 is not a multiple of 128: raise ValueError"),
    ]
    rng = random.Random(91)
    for seed in range(100, 116):
        group_size = rng.choice([32, 64, 128])
        cases.append(case(rng.randint(1, 16), group_size * rng.randint(1, 4), group_size, rng.random() < 0.5,
                          "normal", seed))
    return cases


def _describe_int4(case: Case) -> str:
    rows, cols, group_size, symmetric, kind, seed = case.args
    return (f"quantize_int4(weight [{rows}, {cols}] ({KINDS[kind]}, seed {seed}), group_size={group_size}, "
            f"symmetric={symmetric}), then dequantize_int4 on the codes")


def _tensor(value: Any) -> torch.Tensor | None:
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None


def _int4_hint(case: Case, expected: Any, got: Any) -> str | None:
    rows, cols, group_size, symmetric, kind, seed = case.args
    if expected == "raises ValueError":
        return (f"K = {cols} is not a multiple of group_size = {group_size}: raise ValueError (as the course's "
                "quantizer does) rather than pad or leave a short group")
    if not isinstance(got, dict):
        return "return (codes, scales, zeros) from quantize_int4, and the weight from dequantize_int4"
    groups = cols // group_size
    scales, codes = _tensor(got["scales"]), _tensor(got["codes"])
    want_scales, want_codes = torch.tensor(expected["scales"], dtype=torch.float64), torch.tensor(expected["codes"])
    if scales is None or codes is None:
        return "codes and scales must be tensors (or nested lists) of numbers"
    if symmetric and got["zeros"] is not None:
        return "symmetric: there is no zero point, return zeros = None"
    if not symmetric and got["zeros"] is None:
        return "asymmetric: return one zero point per group, zeros of shape [N, K // group_size]"
    if tuple(scales.shape) != (rows, groups):
        if scales.numel() == 1:
            return (f"one scale per group, not one for the whole tensor: scales has shape [N, K // group_size] = "
                    f"[{rows}, {groups}]")
        if scales.numel() == rows:
            return f"one scale per group of {group_size} along each row, not per row: shape [{rows}, {groups}]"
        if tuple(scales.shape) == (groups, rows):
            return f"scales has shape [N, K // group_size] = [{rows}, {groups}], not its transpose"
        return f"scales has shape [N, K // group_size] = [{rows}, {groups}]"
    if tuple(codes.shape) != (rows, cols):
        return f"codes has the weight's shape, [{rows}, {cols}]: one code per weight (no packing into bytes here)"
    if not torch.equal(codes, codes.round()):
        return "codes are whole numbers: round(w / scale), not w / scale"
    w = case_weight(*case.args).double().reshape(rows, groups, group_size)
    if symmetric and codes.min() >= 0 and codes.max() > 7:
        return "symmetric codes are signed, -8..7: return q = round(w / scale), without adding 8"
    if not symmetric and codes.min() < 0:
        return "asymmetric codes are unsigned, 0..15: add the zero point, u = round(w / scale) + zero"
    if not torch.allclose(scales, want_scales, rtol=1e-5, atol=0):
        zero_group = (w == 0).all(dim=-1)
        if torch.allclose(scales[~zero_group], want_scales[~zero_group], rtol=1e-5, atol=0):
            return "an all-zero group gets scale 1 (any scale reproduces its zeros; 1 keeps the division safe)"
        if not symmetric:
            unwidened = (w.amax(dim=-1) - w.amin(dim=-1)) / 15
            if torch.allclose(scales[~zero_group], unwidened[~zero_group], rtol=1e-5):
                return ("widen each group's range to include 0: lo = min(min w, 0), hi = max(max w, 0), so that "
                        "the zero point is a whole number in 0..15 and 0.0 comes back exactly")
        if groups > 1 and torch.allclose(scales, scales[:1, :1].expand_as(scales), rtol=1e-6):
            return (f"one scale per group, not one for the whole tensor: each group of {group_size} weights along "
                    "a row gets its own max (or range)")
        if groups > 1 and torch.allclose(scales, scales[:, :1].expand_as(scales), rtol=1e-6):
            return f"one scale per group of {group_size} along each row, not one per row"
        ratio = (scales / want_scales).flatten()
        if torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4):
            shown = ratio[0].item()
            return (f"your scales are {shown:.4g} x the expected ones: "
                    + ("scale = max|w| / 7 (7 is the largest code rounding can give)" if symmetric
                       else "scale = (hi - lo) / 15 (16 codes span 15 steps)"))
        return ("scale = max|w| / 7 for each group of group_size weights along a row" if symmetric else
                "scale = (hi - lo) / 15 for each group of group_size weights along a row, lo and hi widened to 0")
    if not symmetric and got["zeros"] != expected["zeros"]:
        return "zero = round(-lo / scale), a whole number in 0..15 (lo = min(min w, 0))"
    if not torch.equal(codes, want_codes.double()):
        s = want_scales[..., None]
        x = (w / s).reshape(rows, cols)
        offset = 0 if symmetric else torch.tensor(expected["zeros"]).double().repeat_interleave(group_size, dim=1)
        mostly = lambda other: (codes == other).double().mean() > 0.95  # noqa: E731 - float32 may differ at the max
        if mostly(torch.floor(x) + offset) or mostly(torch.trunc(x) + offset):
            return ("round to the nearest code (torch.round), not floor or int(): rounding keeps every error "
                    "within scale / 2")
        return "codes = round(w / scale)" + ("" if symmetric else " + zero, clamped to 0..15")
    round_trip = _tensor(got["round trip"])
    want = torch.tensor(expected["round trip"], dtype=torch.float64)
    if round_trip is None or tuple(round_trip.shape) != (rows, cols):
        return f"dequantize_int4 returns the weight's shape, [{rows}, {cols}]"
    if not torch.allclose(round_trip, want, rtol=1e-5, atol=1e-8):
        per_element = want_scales.repeat_interleave(group_size, dim=1)
        if not symmetric and torch.allclose(round_trip, codes * per_element, rtol=1e-5, atol=1e-8):
            return "dequantize: subtract the zero point first, w = (u - zero) x scale"
        if symmetric and torch.allclose(round_trip, (codes + 8) * per_element, rtol=1e-5, atol=1e-8):
            return "dequantize: the codes are signed already, w = q x scale"
        if not symmetric:
            zeros = torch.tensor(expected["zeros"], dtype=torch.float64).repeat_interleave(group_size, dim=1)
            if torch.allclose(round_trip, ((codes - zeros) % 256) * per_element, rtol=1e-5, atol=1e-8):
                return ("dequantize: u - zero wrapped around below 0, as uint8 arithmetic does: convert the codes "
                        "and zeros to a signed or float type (.long() or .float()) before subtracting")
        return ("dequantize: each group's scale multiplies its own group_size columns (repeat_interleave the "
                "scales along K, or reshape to [N, K // group_size, group_size])")
    if got["round trip"] != expected["round trip"]:
        return None
    return ("your dequantize_int4 rebuilds your own codes but not the course's: it must use only codes, scales, "
            "zeros and group_size, and work on int64 codes (convert before subtracting the zero point)")


# Task 2 · reload or recompute

def _tier(spec: Any) -> KVTier:
    return get_tier(spec) if isinstance(spec, str) else KVTier(*spec)


def course_reload_or_recompute(model_name: str, tokens: int, tier: Any, flops: float, include_attention: bool) -> dict:
    """Both times and the winner, from ``perf.kv_tiers`` (a tie goes to reload)."""
    model, tier = get_model(model_name), _tier(tier)
    reload_s = reload_time(model, tokens, tier)
    recompute_s = recompute_time(model, tokens, REFERENCE_GPU, flops=flops, include_attention=include_attention)
    winner = ReloadOrRecompute(tokens, 0.0, reload_s, recompute_s).winner
    return {"decision": winner, "reload_s": reload_s, "recompute_s": recompute_s}


def _kv_call(fn: Callable, model_name: str, tokens: int, tier: Any, flops: float, include_attention: bool) -> Any:
    return fn(get_model(model_name), tokens, _tier(tier), flops, include_attention=include_attention)


def _tied(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TIMES.rel_tol, abs_tol=TIMES.abs_tol)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kv_at_a_tie(expected: Any, got: Any) -> Any:
    """Where reload_s and recompute_s tie within the times' tolerance, the decision the rule gives on the
    learner's own two times ('reload' when reload_s <= recompute_s): 3000 / 1024 s in bytes and FLOPs is
    2.9296875, in GB and TFLOP 2.9296874999999996, and both are right. Elsewhere the reference's decision."""
    want, have = from_plain(expected), from_plain(got)
    times = (have.get("reload_s"), have.get("recompute_s")) if isinstance(have, dict) else ()
    if not _tied(want["reload_s"], want["recompute_s"]) or not all(map(_number, times)):
        return expected
    return to_plain({**want, "decision": "reload" if times[0] <= times[1] else "recompute"})


def _tie_tier() -> list:
    """A tier whose reload of Llama-3.1-8B's KV takes exactly as long as recomputing it at 2 x params x 1024
    FLOP/s: both n / 1024 s, with no latency."""
    model = get_model("Llama-3.1-8B")
    return ["exact tie", model_kv_bytes_per_token(model, "bf16") * 1024, 0.0]


SLOW = ["1 GB/s link", 1e9, 0.0]


def _kv_cases() -> list[Case]:
    def case(model, tokens, tier, flops=500e12, attention=False, why=""):
        return Case((model, tokens, tier, flops, attention), why=why)

    tie_flops = 2 * get_model("Llama-3.1-8B").num_params * 1024
    cases = [
        case("Llama-3.1-8B", 10_000, CPU_DRAM, why="10,000 tokens, 1.31 GB of KV: 26 ms from CPU memory, 0.32 s to "
             "recompute"),
        case("Llama-3.1-8B", 10_100, CPU_DRAM, why="10,100 tokens: 1.32 GB, 26.5 ms against 0.32 s"),
        case("Llama-3.1-8B", 4096, GPU_HBM, why="already in GPU memory: infinite bandwidth, no latency, reload is 0"),
        case("Llama-3.1-8B", 4, LOCAL_NVME, why="4 tokens from an NVMe SSD: its 100 us latency outweighs recomputing"),
        case("Llama-3.1-8B", 7, LOCAL_NVME, why="7 tokens from NVMe: just below the crossover, recompute"),
        case("Llama-3.1-8B", 8, LOCAL_NVME, why="8 tokens from NVMe: just above the crossover, reload"),
        case("Llama-3.1-8B", 10, POOL_TCP, why="10 tokens over TCP: its 200 us latency still wins for recompute"),
        case("Llama-3.1-8B", 11, POOL_TCP, why="11 tokens over TCP: reload"),
        case("Llama-3.1-8B", 64, POOL_RDMA, why="the RDMA pool: 20 us of latency"),
        case("Llama-3.1-8B", 2048, CPU_DRAM_BUSY, why="CPU memory while offloads run: half the DMA engines' 83.4 GB/s"),
        case("Mixtral-8x7B", 8192, CPU_DRAM, why="a mixture of experts recomputes with its ACTIVE parameters"),
        case("Llama-2-7B", 2048, LOCAL_NVME, why="32 KV heads, no GQA: four times the KV bytes of Llama-3's 8"),
        case("Llama-3.1-8B", 10_000, SLOW, why="a link slower per token than the prefill: recompute wins"),
        case("Llama-3.1-8B", 65_536, SLOW, 200e12, True,
             why="with attention counted, recompute grows quadratically: reload wins long prompts back"),
        case("Llama-3.1-8B", 1024, SLOW, 200e12, True, why="with attention, a short prompt: recompute still wins"),
        case("Llama-3.1-8B", 3000, _tie_tier(), tie_flops, why="an exact tie: it goes to reload"),
        case("Llama-3.2-1B", 32_768, CPU_DRAM, 300e12, True, why="attention's 4 x layers x heads x head_dim x n(n+1)/2"),
    ]
    rng = random.Random(92)
    tiers = [GPU_HBM, CPU_DRAM, CPU_DRAM_BUSY, LOCAL_NVME, POOL_RDMA, POOL_TCP, SLOW, ["2 GB/s, 1 ms", 2e9, 1e-3]]
    while len(cases) < 60:
        model = get_model(rng.choice(MODEL_NAMES))
        tier, flops, attention = rng.choice(tiers), rng.choice([100e12, 250e12, 500e12, 900e12]), rng.random() < 0.5
        crossing = crossover_tokens(model, _tier(tier), REFERENCE_GPU, flops=flops, include_attention=attention)
        if crossing is not None and rng.random() < 0.5:  # around the crossover
            tokens = max(1, min(model.max_context, int(crossing) + rng.choice([0, 1])))
        else:
            tokens = min(model.max_context, int(10 ** rng.uniform(0, 5.2)))
        result = course_reload_or_recompute(model.name, tokens, tier, flops, attention)
        if abs(result["reload_s"] - result["recompute_s"]) > 1e-9 * result["recompute_s"]:
            cases.append(case(model.name, tokens, tier, flops, attention))
    return cases


def _describe_kv(case: Case) -> str:
    model, tokens, tier, flops, attention = case.args
    shown = f"get_tier({tier!r})" if isinstance(tier, str) else f"KVTier({tier[0]!r}, {tier[1]:.6g}, {tier[2]:g})"
    return (f"reload_or_recompute(get_model({model!r}), {tokens}, {shown}, {flops:g}"
            + (", include_attention=True)" if attention else ")"))


def _kv_hint(case: Case, expected: Any, got: Any) -> str | None:
    model_name, tokens, tier_spec, flops, attention = case.args
    if not isinstance(got, dict) or set(got) != set(expected):
        return "return a dict with the keys 'decision', 'reload_s' and 'recompute_s'"
    model, tier = get_model(model_name), _tier(tier_spec)
    kv_bytes = tokens * model_kv_bytes_per_token(model, "bf16")
    copy_s = kv_bytes / tier.bandwidth
    reload_s, recompute_s = got["reload_s"], got["recompute_s"]
    if not _close(reload_s, expected["reload_s"]):
        if tier.latency_s and _close(reload_s, copy_s):
            return f"add the tier's fixed latency, tier.latency_s ({tier.latency_s * 1e6:g} us), to the copy time"
        if _close(reload_s, copy_s * GiB_PER_GB + tier.latency_s) or _close(reload_s, copy_s / GiB_PER_GB + tier.latency_s):
            return "bandwidths are in bytes per second and a GB is 1e9 bytes: no 2**30 (GiB) anywhere"
        if _close(reload_s, copy_s / 2 + tier.latency_s):
            return "KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x 2 bytes (bf16)"
        if _close(reload_s, copy_s * model.num_heads / model.num_kv_heads + tier.latency_s):
            return "the cache holds the KV heads only: use model.num_kv_heads, not num_heads"
        if tier.bandwidth == math.inf and not (isinstance(reload_s, (int, float)) and reload_s == 0):
            return "KV already in GPU memory: bytes / inf = 0, and no latency, so reload_s is 0"
        return "reload_s = tokens x KV bytes per token / tier.bandwidth + tier.latency_s"
    if not _close(recompute_s, expected["recompute_s"]):
        linear = 2 * model.active_params * tokens / flops
        pairs_flops = 4 * model.num_layers * model.num_heads * model.head_dim / flops
        if model.active_params != model.num_params and (
                _close(recompute_s, 2 * model.num_params * tokens / flops)
                or _close(recompute_s, expected["recompute_s"] - linear + 2 * model.num_params * tokens / flops)):
            return "a mixture of experts: each token multiplies by its ACTIVE parameters only, model.active_params"
        if attention and _close(recompute_s, linear):
            return "include_attention=True: add 4 x layers x heads x head_dim x n(n+1)/2 FLOPs (causal QK^T and PV)"
        if not attention and recompute_s > expected["recompute_s"]:
            return "count attention's FLOPs only when include_attention is True"
        if attention and _close(recompute_s, expected["recompute_s"] - (1 - model.num_kv_heads / model.num_heads)
                                * pairs_flops * tokens * (tokens + 1) / 2):
            return ("attention's FLOPs count the query heads, model.num_heads: every query head attends; the KV heads "
                    "count only in the KV bytes")
        if attention and (_close(recompute_s, linear + pairs_flops * tokens ** 2)
                          or _close(recompute_s, linear + pairs_flops * tokens ** 2 / 2)):
            return "causal attention: token i attends i + 1 tokens, n(n+1)/2 pairs in all"
        return "recompute_s = 2 x active params x tokens / flops" + (" + attention's FLOPs / flops" if attention else "")
    if got["decision"] not in ("reload", "recompute"):
        return "decision is the string 'reload' or 'recompute'"
    if _tied(expected["reload_s"], expected["recompute_s"]):
        return ("a tie goes to reload (it leaves the GPU's compute free): 'reload' when reload_s <= recompute_s, "
                "judged here on your own two times")
    return "the faster way wins: 'reload' when reload_s <= recompute_s, else 'recompute'"


# Task 3 · the fastest weight scheme

SCHEME_NAMES = tuple(SCHEMES)  # BF16, W4A16, FP8-W8A8: the order ties are broken in


def course_best_scheme(model_name: str, gpu_name: str, batch: int, context_len: int) -> dict:
    """``quant_cost.best_scheme`` and each scheme's decode step time (None where the GPU cannot run it)."""
    model, gpu = get_model(model_name), get_gpu(gpu_name)
    times = {name: decode_step_time(model, name, gpu, batch, context_len) if scheme_available(name, gpu) else None
             for name in SCHEME_NAMES}
    return {"best": best_scheme(model, gpu, batch, context_len), "step_s": times}


def _scheme_call(fn: Callable, model_name: str, gpu_name: str, batch: int, context_len: int) -> Any:
    return fn(get_model(model_name), get_gpu(gpu_name), batch, context_len)


def _step_time(model, gpu, name: str, batch: int, context_len: int, *, memory_roof: bool = True,
               compute_roof: bool = True, overhead: bool = True, scale_bits: bool = True, kv: bool = True,
               all_params: bool = True, attention_bf16: bool = True, efficiency: bool = True) -> float:
    """The decode step time of the exercise's formula, each part switchable, to name a mistake."""
    eff = Efficiency() if efficiency else Efficiency(1.0, 1.0, Efficiency().overhead_s)
    per_weight = {"BF16": 2.0, "W4A16": (4 + (16 / 128 if scale_bits else 0)) / 8, "FP8-W8A8": 1.0}[name]
    peak = gpu.fp8_flops if name == "FP8-W8A8" else gpu.bf16_flops
    weights = (model.num_params if all_params else model.active_params) * per_weight
    kv_bytes = model_kv_bytes_per_token(model, "bf16") * (context_len + 2) * batch if kv else 0.0
    linear = 2 * model.active_params * batch
    attention = 4 * model.num_layers * model.num_heads * model.head_dim * batch * (context_len + 1)
    compute_s = linear / (peak * eff.compute) + attention / ((gpu.bf16_flops if attention_bf16 else peak) * eff.compute)
    memory_s = (weights + kv_bytes) / (gpu.hbm_bandwidth * eff.memory)
    roofs = [t for t, on in ((compute_s, compute_roof), (memory_s, memory_roof)) if on]
    return max(roofs) + (eff.overhead_s if overhead else 0.0)


SCHEME_MISTAKES = (  # (switches, what the hint says), the most specific first
    ({"all_params": False}, "every parameter is read once per step, all experts of a mixture included: "
                            "model.num_params for the bytes (active_params for the FLOPs)"),
    ({"scale_bits": False}, "W4A16 also stores one 16-bit scale per 128 weights: (4 + 16/128) / 8 = 0.515625 "
                            "bytes per weight"),
    ({"kv": False}, "add the KV cache, read for the context_len + 1 tokens and written for the new one: KV bytes "
                    "per token (bf16) x (context_len + 2) x batch"),
    ({"attention_bf16": False}, "attention runs against the bf16 KV cache on the bf16 roof in every scheme; only "
                                "the linear layers use fp8 tensor cores"),
    ({"overhead": False}, "add the fixed per-step overhead, Efficiency().overhead_s = 0.5 ms"),
    ({"efficiency": False}, "divide by the shares of the peaks an engine reaches: 0.5 of the FLOP/s, 0.8 of the "
                            "HBM bandwidth"),
    ({"memory_roof": False}, "a step's time is max(compute, memory) + overhead: FLOPs alone miss that decode is "
                             "bound by the bytes it reads"),
    ({"compute_roof": False}, "a step's time is max(compute, memory) + overhead: at large batches the compute "
                              "roof takes over"),
)


def _scheme_cases() -> list[Case]:
    def case(model, gpu, batch, context_len=1024, why=""):
        return Case((model, gpu, batch, context_len), why=why)

    cases = [
        case("Llama-3.1-70B", "H100-80GB", 1, why="batch 1 is memory-bound: the fewest bytes, W4A16, wins"),
        case("Llama-3.1-70B", "H100-80GB", 256, why="batch 256 is compute-bound: fp8 tensor cores, FP8-W8A8, win"),
        case("Llama-3.1-70B", "H100-80GB", 159, why="one below the crossover batch (160): W4A16"),
        case("Llama-3.1-70B", "H100-80GB", 160, why="the crossover batch: FP8-W8A8"),
        case("Llama-3.1-70B", "A100-80GB", 64, why="an A100 has no fp8 tensor cores: FP8-W8A8 is unavailable (None)"),
        case("Llama-3.1-8B", "A100-80GB", 1024,
             why="A100, batch 1024: BF16 and W4A16 on the same bf16 compute roof, a tie goes to BF16"),
        case("Llama-3.1-8B", "A100-80GB", 1, why="A100, batch 1: W4A16"),
        case("Llama-3.1-8B", "H100-80GB", 4096,
             why="context 1024: every sequence's KV read keeps the 8B memory-bound, W4A16 wins even at 4096"),
        case("Llama-3.1-8B", "H100-80GB", 128, 128, why="short contexts: the 8B crosses over too"),
        case("Llama-3.1-8B", "H100-80GB", 512, 128,
             why="a compute-bound FP8-W8A8 step: linear layers on fp8 tensor cores, attention on bf16 ones"),
        case("Mixtral-8x7B", "H200-141GB", 1024,
             why="a mixture of experts reads every expert but multiplies by the active ones"),
        case("Llama-3.1-70B", "L4-24GB", 300, why="L4: fp8 tensor cores at 300 GB/s, one below its crossover"),
        case("Llama-3.1-70B", "L4-24GB", 301, why="L4 at its crossover batch"),
        case("Llama-3.1-70B", "B200-180GB", 147, why="B200 at its crossover batch"),
    ]
    rng = random.Random(93)
    gpus = sorted(GPUS)
    while len(cases) < 60:
        model, gpu = rng.choice(MODEL_NAMES), rng.choice(gpus)
        context_len = rng.choice([128, 512, 1024, 2048, 8192])
        edge = crossover_batch(get_model(model), get_gpu(gpu), context_len)
        if edge is not None and rng.random() < 0.5:
            batch = max(1, edge + rng.choice([-1, 0]))
        else:
            batch = int(2 ** rng.uniform(0, 12))
        times = sorted(t for t in course_best_scheme(model, gpu, batch, context_len)["step_s"].values() if t)
        if times[1] - times[0] > 1e-9 * times[0]:  # no near-tie for the win
            cases.append(case(model, gpu, batch, context_len))
    return cases


def _scheme_at_a_tie(expected: Any, got: Any) -> Any:
    """Where the fastest schemes' times tie within the times' tolerance, the best by the rule on the learner's
    own step times (the smallest; equal ones to the earlier scheme in the order BF16, W4A16, FP8-W8A8), among
    those the reference ties. Elsewhere the reference's best."""
    want, have = from_plain(expected), from_plain(got)
    times = {name: t for name, t in want["step_s"].items() if t is not None}
    fastest = min(times.values())
    tied = [name for name in SCHEME_NAMES if name in times and _tied(times[name], fastest)]
    mine = have.get("step_s") if isinstance(have, dict) else None
    if len(tied) < 2 or not isinstance(mine, dict) or not all(_number(mine.get(name)) for name in tied):
        return expected
    return to_plain({**want, "best": min(tied, key=lambda name: (mine[name], SCHEME_NAMES.index(name)))})


def _describe_scheme(case: Case) -> str:
    model, gpu, batch, context_len = case.args
    return f"best_scheme(get_model({model!r}), get_gpu({gpu!r}), batch={batch}, context_len={context_len})"


def _scheme_hint(case: Case, expected: Any, got: Any) -> str | None:
    model_name, gpu_name, batch, context_len = case.args
    if not isinstance(got, dict) or set(got) != {"best", "step_s"} or not isinstance(got["step_s"], dict):
        return "return {'best': name, 'step_s': {'BF16': s, 'W4A16': s, 'FP8-W8A8': s or None}}"
    if set(got["step_s"]) != set(SCHEME_NAMES):
        return f"step_s has one entry per scheme, keys {list(SCHEME_NAMES)}"
    model, gpu = get_model(model_name), get_gpu(gpu_name)
    if expected["step_s"]["FP8-W8A8"] is None and got["step_s"]["FP8-W8A8"] is not None:
        return (f"{gpu.name} has no fp8 tensor cores (gpu.fp8_flops == 0): FP8-W8A8 cannot run there; its step_s "
                "is None and it is never the best")
    if expected["step_s"]["FP8-W8A8"] is not None and got["step_s"]["FP8-W8A8"] is None:
        return f"{gpu.name} has fp8 tensor cores (gpu.fp8_flops > 0): time FP8-W8A8 too"
    for name in SCHEME_NAMES:
        want, have = expected["step_s"][name], got["step_s"][name]
        if want is None or _close(have, want):
            continue
        for switches, hint in SCHEME_MISTAKES:
            if _close(have, _step_time(model, gpu, name, batch, context_len, **switches)):
                return f"{name}: {hint}"
        return (f"{name}: time = max(compute, memory) + 0.5 ms, memory = (weights + KV) / (0.8 x HBM bandwidth), "
                "compute = linear FLOPs / (0.5 x the scheme's peak) + attention FLOPs / (0.5 x bf16 peak)")
    if got["best"] not in SCHEME_NAMES:
        return f"best is one of {list(SCHEME_NAMES)}, spelled as shown"
    times = {n: t for n, t in expected["step_s"].items() if t is not None}
    if times.get(got["best"]) == min(times.values()):
        return "equal times go to the earlier scheme in the order BF16, W4A16, FP8-W8A8 (keep the weights exact)"
    return "best is the scheme with the smallest step time (among those the GPU can run)"


def _register_calls() -> None:
    """Make the call kinds known to ``calls.run_cases`` (in whichever process imports this module)."""
    calls.CALLS.setdefault("int4_round_trip", _int4_call)
    calls.CALLS.setdefault("kv_reload", _kv_call)
    calls.CALLS.setdefault("quant_scheme", _scheme_call)


_register_calls()

TASKS = (
    Task(1, "Group-wise int4 quantization", "quantize_int4", _int4_cases, int4_expected, rule=FLOAT32,
         hint=_int4_hint, call="int4_round_trip", describe=_describe_int4, examples=0),
    Task(2, "Reload or recompute", "reload_or_recompute", _kv_cases, course_reload_or_recompute, rule=TIMES,
         hint=_kv_hint, call="kv_reload", describe=_describe_kv, examples=2, at_a_tie=_kv_at_a_tie),
    Task(3, "The fastest weight scheme", "best_scheme", _scheme_cases, course_best_scheme, rule=TIMES,
         hint=_scheme_hint, call="quant_scheme", describe=_describe_scheme, examples=2, at_a_tie=_scheme_at_a_tie),
)
