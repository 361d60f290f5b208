"""Exercise 09's tasks against solutions in other styles (they must pass), against the mistake each
stated rule is there to catch (each must fail on the case built for that rule, with its hint), and
against answers a learner might try to slip past the check (hard-coded examples, right types with
wrong values, a lossless "quantizer")."""

import textwrap

import pytest
import torch

from course_lib.exercise_files import course_exercise, solution_file
from course_lib.grading.checks import exercise_tasks
from course_lib.grading.checks.serving_tradeoffs import case_weight, course_int4
from course_lib.quant import int4
from test_checks import caught_mistake, function_name, verdict

EXERCISE = "09_serving_tradeoffs"

QUANTIZE = """
    def quantize_int4(weight, group_size, symmetric):
        n, k = weight.shape
        if k % group_size:
            raise ValueError("K is not a multiple of group_size")
        w = weight.float().reshape(n, k // group_size, group_size)
        {body}
        return codes.reshape(n, k).to(torch.int64), scales, zeros
"""
SYMMETRIC = """if symmetric:
            scales = w.abs().amax(dim=-1) / 7
            scales = torch.where(scales > 0, scales, torch.ones_like(scales))
            codes, zeros = torch.round(w / scales[..., None]), None"""
ASYMMETRIC = """lo, hi = w.amin(dim=-1).clamp(max=0), w.amax(dim=-1).clamp(min=0)
            scales = (hi - lo) / 15
            scales = torch.where(scales > 0, scales, torch.ones_like(scales))
            zeros = torch.round(-lo / scales).clamp(0, 15)
            codes = (torch.round(w / scales[..., None]) + zeros[..., None]).clamp(0, 15)"""


def quantize_with(symmetric: str = SYMMETRIC, asymmetric: str = ASYMMETRIC) -> str:
    body = f"{symmetric}\n        else:\n            {asymmetric}"
    return QUANTIZE.replace("{body}", body)


def with_dequantize(source: str) -> str:
    """The solution's quantize_int4 (the graded function) beside a different ``dequantize_int4``."""
    return "\n_solution_quantize = quantize_int4\n" + textwrap.dedent("""
    def quantize_int4(weight, group_size, symmetric):
        return _solution_quantize(weight, group_size, symmetric)
    """) + textwrap.dedent(source)


RELOAD = """
    def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
        kv_bytes = {kv}
        reload_s = {reload}
        work = {work}
        if include_attention:
            work += {attention}
        recompute_s = work / flops
        return {{"decision": "reload" if {decide} else "recompute", "reload_s": reload_s, "recompute_s": recompute_s}}
"""
RIGHT = dict(kv="tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2",
             reload="kv_bytes / tier.bandwidth + tier.latency_s", work="2 * model.active_params * tokens",
             attention="4 * model.num_layers * model.num_heads * model.head_dim * tokens * (tokens + 1) / 2",
             decide="reload_s <= recompute_s")


def reload_with(**changes) -> str:
    return RELOAD.format(**{**RIGHT, **changes})


SCHEME = """
    def best_scheme(model, gpu, batch, context_len=1024):
        per_weight = {{"BF16": 2, "W4A16": {w4}, "FP8-W8A8": 1}}
        kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 * {kv_tokens} * batch
        linear = 2 * model.active_params * batch
        attention = 4 * model.num_layers * model.num_heads * model.head_dim * (context_len + 1) * batch
        step_s = {{}}
        for name, bytes_per_weight in per_weight.items():
            peak = {fp8_peak} if name == "FP8-W8A8" else gpu.bf16_flops
            if {unavailable}:
                step_s[name] = None
                continue
            memory_s = ({params} * bytes_per_weight + kv_bytes) / (0.8 * gpu.hbm_bandwidth)
            compute_s = linear / (0.5 * peak) + attention / (0.5 * {attention_peak})
            step_s[name] = {time}
        best = min((n for n, t in step_s.items() if t is not None), key={key})
        return {{"best": best, "step_s": step_s}}
"""
SCHEME_RIGHT = dict(w4="(4 + 16 / 128) / 8", fp8_peak="gpu.fp8_flops", kv_tokens="(context_len + 2)", unavailable="not peak",
                    params="model.num_params", attention_peak="gpu.bf16_flops",
                    time="max(compute_s, memory_s) + 0.0005", key="step_s.get")


def scheme_with(**changes) -> str:
    return SCHEME.format(**{**SCHEME_RIGHT, **changes})


ALTERNATIVES = [
    """
    def quantize_int4(weight, group_size, symmetric):
        # numpy in float64, codes and scales as nested lists, zero points as floats holding integers
        import numpy as np
        w = weight.numpy().astype(np.float64)
        n, k = w.shape
        if k % group_size:
            raise ValueError(f"{k} % {group_size} != 0")
        g = w.reshape(n, k // group_size, group_size)
        if symmetric:
            scales = np.abs(g).max(axis=-1) / 7
            scales[scales == 0] = 1
            return np.rint(g / scales[..., None]).reshape(n, k).astype(int).tolist(), scales.tolist(), None
        lo, hi = np.minimum(g.min(axis=-1), 0), np.maximum(g.max(axis=-1), 0)
        scales = (hi - lo) / 15
        scales[scales == 0] = 1
        zeros = np.clip(np.rint(-lo / scales), 0, 15)
        codes = np.clip(np.rint(g / scales[..., None]) + zeros[..., None], 0, 15)
        return codes.reshape(n, k).astype(np.int64), scales, zeros

    def dequantize_int4(codes, scales, zeros, group_size):
        import numpy as np
        codes, scales = np.asarray(codes, dtype=np.float64), np.asarray(scales, dtype=np.float64)
        offset = 0 if zeros is None else np.repeat(np.asarray(zeros, dtype=np.float64), group_size, axis=1)
        return (codes - offset) * np.repeat(scales, group_size, axis=1)
    """,
    """
    def quantize_int4(weight, group_size, symmetric):
        # a loop over groups, multiplying by the reciprocal of the scale, uint8 codes
        n, k = weight.shape
        if k % group_size:
            raise ValueError("pad K to a multiple of the group size")
        codes = torch.empty(n, k, dtype=torch.int16)
        scales = torch.empty(n, k // group_size)
        zeros = None if symmetric else torch.empty(n, k // group_size, dtype=torch.uint8)
        for g in range(k // group_size):
            block = weight[:, g * group_size:(g + 1) * group_size]
            if symmetric:
                s = block.abs().max(dim=1).values / 7
                s[s == 0] = 1
                codes[:, g * group_size:(g + 1) * group_size] = (block * (1 / s)[:, None]).round().to(torch.int16)
            else:
                lo = torch.minimum(block.min(dim=1).values, torch.tensor(0.0))
                hi = torch.maximum(block.max(dim=1).values, torch.tensor(0.0))
                s = (hi - lo) / 15
                s[s == 0] = 1
                z = (-lo / s).round().clamp(0, 15)
                zeros[:, g] = z.to(torch.uint8)
                codes[:, g * group_size:(g + 1) * group_size] = ((block / s[:, None]).round() + z[:, None]).clamp(0, 15)
            scales[:, g] = s
        return codes, scales, zeros

    def dequantize_int4(codes, scales, zeros, group_size):
        s = scales.repeat_interleave(group_size, dim=1).double()
        if zeros is None:
            return codes.double() * s
        return (codes.long() - zeros.long().repeat_interleave(group_size, dim=1)).double() * s
    """,
    """
    def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
        # the course's KV size per token, a Fraction, a tuple-free dict in another order
        from fractions import Fraction
        from course_lib.perf.kv import model_kv_bytes_per_token
        reload_s = tokens * model_kv_bytes_per_token(model, "bf16") / tier.bandwidth + tier.latency_s
        pairs = Fraction(tokens * (tokens + 1), 2) if include_attention else 0
        attention = 4 * model.num_layers * model.num_heads * model.head_dim * pairs
        recompute_s = (2 * model.active_params * tokens + attention) / flops
        return dict(recompute_s=float(recompute_s), reload_s=reload_s,
                    decision=["recompute", "reload"][reload_s <= recompute_s])
    """,
    """
    def best_scheme(model, gpu, batch, context_len=1024):
        # the course's roofline step_cost for the bf16 FLOPs, then the scheme's bytes and roofs
        import numpy as np
        from course_lib.perf.roofline import step_cost
        base = step_cost(model, gpu, [(context_len, 1)] * batch)
        kv = base.bytes - 2 * model.num_params
        linear = 2 * model.active_params * batch
        times = {}
        for name, per_weight, peak in (("BF16", 2, gpu.bf16_flops), ("W4A16", 4.125 / 8, gpu.bf16_flops),
                                       ("FP8-W8A8", 1, gpu.fp8_flops)):
            if peak:
                compute = linear / peak / 0.5 + (base.flops - linear) / gpu.bf16_flops / 0.5
                times[name] = np.float64(max(compute, (model.num_params * per_weight + kv) / gpu.hbm_bandwidth / 0.8)
                                         + 5e-4)
            else:
                times[name] = None
        ranked = sorted((t, i, n) for i, (n, t) in enumerate(times.items()) if t is not None)
        return {"step_s": times, "best": ranked[0][2]}
    """,
]


@pytest.mark.parametrize("source", ALTERNATIVES, ids=function_name)
def test_correct_solutions_in_other_styles_pass(source):
    result = verdict(EXERCISE, function_name(source), source)
    assert result.passed, "\n".join(result.report())


MISTAKES = [  # (wrong source, the hand-built case that must catch it, words the hint must contain)
    (quantize_with(asymmetric=ASYMMETRIC.replace("+ zeros[..., None]).clamp(0, 15)", ").clamp(-8, 7)")),
     "codes round(w / scale) + zero", "add the zero point"),
    (with_dequantize("""
    def dequantize_int4(codes, scales, zeros, group_size):   # forgets the zero point
        n, k = codes.shape
        return (codes.float().reshape(n, k // group_size, group_size) * scales[..., None]).reshape(n, k)
    """), "asymmetric: scale", "subtract the zero point"),
    (quantize_with(symmetric=SYMMETRIC.replace("w.abs().amax(dim=-1) / 7", "w.abs().amax() / 7 * torch.ones(w.shape[:2])")),
     "outlier", "not one for the whole tensor"),
    (quantize_with(symmetric=SYMMETRIC.replace("torch.round(w / scales[..., None])", "torch.floor(w / scales[..., None])")),
     "symmetric: scale", "not floor"),
    (quantize_with(asymmetric=ASYMMETRIC.replace("torch.round(w / scales[..., None])", "(w / scales[..., None]).long()")),
     "asymmetric: scale", "not floor or int()"),
    (quantize_with(asymmetric=ASYMMETRIC.replace(".clamp(max=0)", "").replace(".clamp(min=0)", "")),
     "only positive", "widen each group's range to include 0"),
    (quantize_with(symmetric=SYMMETRIC.replace("/ 7", "/ 8")), "symmetric: scale", "max|w| / 7"),
    (quantize_with(symmetric=SYMMETRIC.replace("scales = torch.where(scales > 0, scales, torch.ones_like(scales))",
                                               "scales = scales.clamp(min=1e-8)")), "all-zero group gets scale 1",
     "scale 1"),
    (quantize_with(symmetric=SYMMETRIC.replace("torch.round(w / scales[..., None])",
                                               "torch.round(w / scales[..., None]) + 8")),
     "symmetric: scale", "without adding 8"),
    (QUANTIZE.replace("        if k % group_size:\n            raise ValueError(\"K is not a multiple of group_size\")\n",
                      "        k -= k % group_size\n        weight = weight[:, :k]\n")
     .replace("{body}", f"{SYMMETRIC}\n        else:\n            {ASYMMETRIC}"), "raise ValueError", "raise ValueError"),
    (reload_with(reload="kv_bytes / tier.bandwidth"), "4 tokens from an NVMe SSD", "fixed latency"),
    (reload_with(reload="kv_bytes / 2**30 / (tier.bandwidth / 1e9) + tier.latency_s"), "10,000 tokens", "2**30"),
    (reload_with(kv="tokens * model.num_layers * model.num_kv_heads * model.head_dim * 2"), "10,000 tokens",
     "2 (K and V)"),
    (reload_with(kv="tokens * 2 * model.num_layers * model.num_heads * model.head_dim * 2"), "10,000 tokens",
     "num_kv_heads"),
    (reload_with(work="2 * model.num_params * tokens"), "ACTIVE parameters", "active_params"),
    (reload_with(attention="4 * model.num_layers * model.num_heads * model.head_dim * tokens ** 2"),
     "n(n+1)/2", "i + 1 tokens"),
    (reload_with(decide="reload_s < recompute_s"), "exact tie", "a tie goes to reload"),
    (reload_with(attention="0"), "grows quadratically", "include_attention=True: add"),
    (scheme_with(unavailable="False", fp8_peak="(gpu.fp8_flops or 2 * gpu.bf16_flops)"), "A100 has no fp8",
     "no fp8 tensor cores"),
    (scheme_with(time="compute_s + 0.0005"), "batch 1 is memory-bound", "FLOPs alone"),
    (scheme_with(time="max(compute_s, memory_s)"), "batch 1 is memory", "0.5 ms"),
    (scheme_with(w4="0.5"), "batch 1 is memory-bound", "0.515625"),
    (scheme_with(params="model.active_params"), "mixture of experts", "every parameter is read"),
    (scheme_with(attention_peak="peak"), "a compute-bound FP8-W8A8 step", "bf16 roof"),
    (scheme_with(kv_tokens="0"), "batch 1 is memory-bound", "KV cache"),
    (scheme_with(key="lambda n: (step_s[n], n == 'BF16')"), "a tie goes to BF16", "equal times"),
]


@pytest.mark.parametrize("source, case, hint", MISTAKES, ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_each_stated_rule_has_a_case_that_catches_its_mistake(source, case, hint):
    result, caught = caught_mistake(EXERCISE, source, case)
    assert any(hint in c.hint for c in caught), "\n".join(result.report(10))


SLIPS = [  # answers that look right on the worked examples, or have the right types, and are wrong
    """
    def quantize_int4(weight, group_size, symmetric):
        # "lossless": the weight itself as its codes, scale 1
        n, k = weight.shape
        if k % group_size:
            raise ValueError("no")
        ones = torch.ones(n, k // group_size)
        return weight, ones, None if symmetric else torch.zeros(n, k // group_size, dtype=torch.int64)

    def dequantize_int4(codes, scales, zeros, group_size):
        return codes
    """,
    """
    def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
        # the worked example, hard-coded
        return {"decision": "reload", "reload_s": 0.0262244, "recompute_s": 0.3212}
    """,
    """
    def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
        # the right keys and types, and always "reload"
        return {"decision": "reload", "reload_s": tokens * 131072 / 50e9, "recompute_s": 2 * 8.03e9 * tokens / 5e14}
    """,
    """
    def best_scheme(model, gpu, batch, context_len=1024):
        # the lesson's rule of thumb: W4A16 at small batches, FP8 at large ones, no times worked out
        best = "W4A16" if batch < 160 else ("FP8-W8A8" if gpu.fp8_flops else "BF16")
        return {"best": best, "step_s": {"BF16": 1.0, "W4A16": 0.5, "FP8-W8A8": 0.7 if gpu.fp8_flops else None}}
    """,
]


@pytest.mark.parametrize("source", SLIPS, ids=function_name)
def test_answers_that_only_look_right_fail(source):
    result = verdict(EXERCISE, function_name(source), source)
    assert not result.passed
    assert len(result.failures) > len(result.cases) // 2, "\n".join(result.report(5))


def test_the_starter_fails_every_task_as_not_done():
    from course_lib.grading.__main__ import grade_file
    from course_lib.paths import REPO_ROOT

    solved = grade_file(REPO_ROOT / "solutions" / solution_file(EXERCISE))
    assert solved.status == "graded" and solved.score == len(solved.checks) == 3, [c.message for c in solved.checks]
    untouched = grade_file(course_exercise(EXERCISE))
    assert untouched.score == 0 and all("not done yet" in c.message for c in untouched.checks)


def test_a_quantizer_without_its_dequantizer_is_told_to_write_it():
    names_source = """
    def quantize_int4(weight, group_size, symmetric):
        return None
    """
    from test_checks import namespace
    from course_lib.grading.selfcheck import Checker
    names = namespace(EXERCISE, {"quantize_int4": names_source})
    del names["dequantize_int4"]
    result = Checker(EXERCISE).verdict(names["quantize_int4"])
    assert not result.passed
    assert any("dequantize_int4 is not defined" in c.got for c in result.failures)


def test_the_cases_keep_clear_of_rounding_ties_and_match_the_library():
    """Every weight's codes are the same whether computed in float32 or float64, and the expected
    values are the library's own quantizer's."""
    task = exercise_tasks(EXERCISE)[0]
    cases = task.cases()
    for case in cases:
        expected = task.reference(*case.args)
        rows, cols, group_size, symmetric, kind, seed = case.args
        if cols % group_size:
            assert expected == "raises ValueError"
            with pytest.raises(ValueError, match="not a multiple"):
                int4.quantize_int4(case_weight(*case.args), group_size, symmetric)
            continue
        w = case_weight(*case.args)
        codes, scales, zeros, dequantized = course_int4(w, group_size, symmetric)
        assert expected["codes"] == codes.tolist()
        g = w.double().reshape(rows, cols // group_size, group_size)
        again = torch.round(g / scales.double()[..., None]).reshape(rows, cols)
        if not symmetric:
            again = (again + zeros.double().repeat_interleave(group_size, dim=1)).clamp(0, 15)
        assert torch.equal(again.long(), codes)
        assert ((w - dequantized).abs() <= scales.repeat_interleave(group_size, dim=1) / 2 * (1 + 1e-5)).all()


def test_the_worked_examples_come_out_as_the_lesson_says():
    tasks = exercise_tasks(EXERCISE)
    example = tasks[1].reference("Llama-3.1-8B", 10_000, "CPU DRAM (PCIe Gen5, DMA)", 500e12, False)
    assert example["decision"] == "reload"
    assert abs(example["reload_s"] - 0.0262) < 5e-4 and abs(example["recompute_s"] - 0.321) < 1e-3
    assert tasks[2].reference("Llama-3.1-70B", "H100-80GB", 1, 1024)["best"] == "W4A16"
    assert tasks[2].reference("Llama-3.1-70B", "H100-80GB", 159, 1024)["best"] == "W4A16"
    assert tasks[2].reference("Llama-3.1-70B", "H100-80GB", 160, 1024)["best"] == "FP8-W8A8"
    assert tasks[2].reference("Llama-3.1-70B", "A100-80GB", 1024, 1024)["step_s"]["FP8-W8A8"] is None


def test_the_learner_side_dequantizes_codes_it_is_sent_and_never_makes_them(monkeypatch):
    """The course's codes for the second weight arrive as case data: a learner cell that replaces
    ``course_int4`` (to hand its own dequantizer codes it made itself) changes nothing."""
    from course_lib.grading.checks import serving_tradeoffs
    from test_checks import namespace

    task = exercise_tasks(EXERCISE)[0]
    case = next(c for c in task.cases() if c.kwargs["course_codes"] and not c.args[3])  # asymmetric
    expected = task.reference(*case.args, **case.kwargs)
    quantize = namespace(EXERCISE)["quantize_int4"]

    def replaced(*args):
        raise AssertionError("the learner's process computed the course's codes")

    monkeypatch.setattr(serving_tradeoffs, "course_int4", replaced)
    got = serving_tradeoffs._int4_call(quantize, *case.args, **case.kwargs)
    want = torch.tensor(expected["dequantized from the course's codes"])
    assert torch.allclose(got["dequantized from the course's codes"].double(), want.double(), rtol=1e-6)


def test_a_decorated_quantizer_still_finds_its_dequantizer():
    source = "@torch.no_grad()\n" + textwrap.dedent(quantize_with())
    result = verdict(EXERCISE, "quantize_int4", source)
    assert result.passed, "\n".join(result.report(5))


def test_uint8_wraparound_in_dequantize_gets_its_own_hint():
    source = with_dequantize("""
    def dequantize_int4(codes, scales, zeros, group_size):
        s = scales.repeat_interleave(group_size, dim=1)
        if zeros is None:
            return codes * s
        return (codes.to(torch.uint8) - zeros.to(torch.uint8).repeat_interleave(group_size, dim=1)) * s
    """)
    result = verdict(EXERCISE, "quantize_int4", source)
    assert not result.passed
    assert any("wrapped around" in c.hint for c in result.failures), "\n".join(result.report(5))
