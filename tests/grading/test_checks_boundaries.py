"""Decisions on their boundaries: every comparison a task states ("at or above", "a tie goes to",
"at most", "fewer than") has a hand-built case exactly on it, that case catches the off-by-one
variant, and a decision derived from floats is never lost to one ulp of a correct formulation
(issue 30: a tie built exact in any units, or judged by the learner's own numbers, as the task says)."""

import math
from fractions import Fraction

import pytest

from course_lib.grading.checks.roofline import (BYTE_MISTAKES, FLOP_MISTAKES, TIE_AT_THE_RIDGE, roofline_step,
                                                 step_variant)
from course_lib.grading.selfcheck import Checker
from course_lib.perf.hardware import get_gpu
from course_lib.perf.models import get_model
from test_checks import caught_mistake, verdict

# Exercise 04, task 1: the step exactly on the ridge point

STEP = """
    def step_intensity(model_name, gpu_name, requests):
        model, gpu = get_model(model_name), get_gpu(gpu_name)
        pairs = sum(new * cached + new * (new + 1) // 2 for cached, new in requests)
        flops = 2 * model.active_params * sum(new for _, new in requests) + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
        kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
        moved = 2 * model.num_params + kv * sum(cached + 2 * new for cached, new in requests)
        return {"flops": flops, "bytes": moved, "intensity": flops / moved, "bound": BOUND}
"""

# the ways a learner may compare (flops, bytes) with the GPU's (peak FLOP/s, bandwidth): True for "compute"
COMPARISONS = {
    "the two ratios": lambda f, b, peak, bw: f / b >= peak / bw,
    "the two times": lambda f, b, peak, bw: f / peak >= b / bw,
    "multiplied out": lambda f, b, peak, bw: f * bw >= peak * b,
    "ridge x bytes": lambda f, b, peak, bw: f >= peak / bw * b,
    "ratio of ratios": lambda f, b, peak, bw: (f / b) / (peak / bw) >= 1,
    "TFLOP per GB": lambda f, b, peak, bw: (f / 1e12) / (b / 1e9) >= (peak / 1e12) / (bw / 1e9),
    "TFLOP per GB, in FLOP/byte": lambda f, b, peak, bw: (f / 1e12) / (b / 1e9) * 1000 >= peak / bw,
    "times in TFLOP and GB": lambda f, b, peak, bw: (f / 1e12) / (peak / 1e12) >= (b / 1e9) / (bw / 1e9),
    "GFLOP per GB": lambda f, b, peak, bw: (f / 1e9) / (b / 1e9) >= (peak / 1e9) / (bw / 1e9),
    "TFLOP per TB": lambda f, b, peak, bw: (f / 1e12) / (b / 1e12) >= (peak / 1e12) / (bw / 1e12),
    "bytes in GB only": lambda f, b, peak, bw: f / (b / 1e9) >= peak / (bw / 1e9),
}


def test_the_ridge_tie_is_exact_and_stays_exact_in_every_formulation():
    model, gpu = get_model("Llama-3.2-1B"), get_gpu("L4-24GB")
    step = roofline_step("Llama-3.2-1B", "L4-24GB", TIE_AT_THE_RIDGE)
    flops, moved = step["flops"], step["bytes"]
    assert Fraction(flops) / Fraction(moved) == Fraction(gpu.bf16_flops) / Fraction(gpu.hbm_bandwidth)
    assert step["bound"] == "compute"
    for name, at_or_above in COMPARISONS.items():
        assert at_or_above(flops, moved, gpu.bf16_flops, gpu.hbm_bandwidth), name
    # and in the learner's own arithmetic: the formula's floats as a learner computes them
    new = sum(n for _, n in TIE_AT_THE_RIDGE)
    assert 2 * model.active_params * new + 4 * model.num_layers * model.num_heads * model.head_dim * sum(
        n * c + n * (n + 1) // 2 for c, n in TIE_AT_THE_RIDGE) == flops


def test_greater_than_instead_of_at_or_above_the_ridge_fails_on_the_tie():
    source = STEP.replace("BOUND", '"compute" if flops / moved > gpu.bf16_flops / gpu.hbm_bandwidth else "memory"')
    result, caught = caught_mistake("04_roofline", source, "exactly at the L4's ridge point")
    assert [c.why for c in result.failures] == [caught[0].why], "\n".join(result.report(10))
    assert ">=" in caught[0].hint and "exactly on the ridge point" in caught[0].hint, caught[0].hint


def test_at_or_above_the_ridge_passes_however_it_is_compared():
    for comparison in ("flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth",
                       "flops / gpu.bf16_flops >= moved / gpu.hbm_bandwidth",
                       "flops * gpu.hbm_bandwidth >= gpu.bf16_flops * moved"):
        source = STEP.replace("BOUND", f'"compute" if {comparison} else "memory"')
        result = verdict("04_roofline", "step_intensity", source)
        assert result.passed, comparison + "\n" + "\n".join(result.report())


def test_a_learner_who_works_in_tflop_and_gb_passes():
    result = verdict("04_roofline", "step_intensity", """
        def step_intensity(model_name, gpu_name, requests):
            model, gpu = get_model(model_name), get_gpu(gpu_name)
            kv_gb_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 / 1e9
            tflop = gb = 0.0
            for cached, new in requests:   # per request, in TFLOP and GB
                attended = new * cached + new * (new + 1) / 2
                tflop += (2 * model.active_params * new + 4 * model.num_layers * model.num_heads * model.head_dim * attended) / 1e12
                gb += kv_gb_per_token * (cached + new) + kv_gb_per_token * new
            gb += 2 * model.num_params / 1e9
            intensity = tflop / gb * 1000            # TFLOP/GB -> FLOP/byte
            ridge = (gpu.bf16_flops / 1e12) / (gpu.hbm_bandwidth / 1e9) * 1000
            return {"flops": tflop * 1e12, "bytes": gb * 1e9, "intensity": intensity,
                    "bound": "compute" if intensity >= ridge else "memory"}
    """)
    assert result.passed, "\n".join(result.report())


def test_the_case_just_below_the_tie_catches_a_ridge_cut_to_a_whole_number():
    source = STEP.replace("BOUND", '"compute" if flops / moved >= int(gpu.bf16_flops / gpu.hbm_bandwidth) else "memory"')
    caught_mistake("04_roofline", source, "just below the ridge point")


# Exercise 04, task 1: the hint names the mistake made

PARTS = {"PAIRS": "new * cached + new * (new + 1) // 2",
         "FLOPS": "2 * model.active_params * new_tokens + 4 * model.num_layers * model.num_heads * model.head_dim * pairs",
         "KV": "2 * model.num_layers * model.num_kv_heads * model.head_dim * 2",
         "MOVED": "2 * model.num_params + kv * sum(cached + 2 * new for cached, new in requests)"}
LEARNER_STEP = """
    def step_intensity(model_name, gpu_name, requests):
        model, gpu = get_model(model_name), get_gpu(gpu_name)
        new_tokens = sum(new for _, new in requests)
        pairs = sum(PAIRS for cached, new in requests)
        flops = FLOPS
        kv = KV
        moved = MOVED
        return {"flops": flops, "bytes": moved, "intensity": flops / moved,
                "bound": "compute" if flops / moved >= gpu.bf16_flops / gpu.hbm_bandwidth else "memory"}
"""


def learner_step(**changed: str) -> str:
    source = LEARNER_STEP
    for part, text in {**PARTS, **changed}.items():
        source = source.replace(part, text)
    return source


HINTED_MISTAKES = [  # (a learner's mistake, words of the hint it must get on every case it fails)
    ({"FLOPS": "2 * model.active_params * new_tokens"}, "add attention's FLOPs"),
    ({"FLOPS": PARTS["FLOPS"].replace("active_params", "num_params")}, "ACTIVE parameters"),
    ({"FLOPS": PARTS["FLOPS"].replace("num_heads", "num_kv_heads")}, "count the query heads, model.num_heads"),
    ({"FLOPS": PARTS["FLOPS"].replace("2 * model.active_params", "model.active_params")}, "a multiply-add is 2 FLOPs"),
    ({"FLOPS": PARTS["FLOPS"].replace("+ 4 *", "+ 2 *")}, "two matrix products"),
    ({"PAIRS": "new * cached"}, "also attend each other and themselves"),
    ({"PAIRS": "new * (cached + new)"}, "attention is causal"),
    ({"PAIRS": "new * cached + new * (new - 1) // 2"}, "a token attends itself too"),
    ({"PAIRS": "(cached + new) * (cached + new + 1) // 2"}, "only the new tokens are computed"),
    ({"MOVED": PARTS["MOVED"].replace("num_params", "active_params")}, "ALL parameters"),
    ({"MOVED": "2 * model.num_params"}, "add the KV cache"),
    ({"KV": PARTS["KV"].replace("num_kv_heads", "num_heads")}, "the KV heads only"),
    ({"KV": "model.num_layers * model.num_kv_heads * model.head_dim * 2"}, "a key AND a value"),
    ({"KV": "2 * model.num_layers * model.num_kv_heads * model.head_dim"}, "2 bytes a number (bf16)"),
    ({"MOVED": PARTS["MOVED"].replace("2 * model.num_params", "model.num_params")}, "the weights are bf16"),
    ({"MOVED": PARTS["MOVED"].replace("cached + 2 * new", "cached + new")}, "also written once"),
    ({"MOVED": PARTS["MOVED"].replace("cached + 2 * new", "cached")}, "cached + 2 x new"),
]


@pytest.mark.parametrize("change, words", HINTED_MISTAKES, ids=[words for _, words in HINTED_MISTAKES])
def test_the_hint_names_the_mistake_made(change, words):
    """Every failing case names the mistake, unless that case cannot tell it from the one it names (a prefill
    without cached tokens: attending only cached tokens is attending nothing); the hint never names a
    mistake that gives another value."""
    task = Checker("04_roofline").tasks["step_intensity"]
    result = verdict("04_roofline", "step_intensity", learner_step(**change))
    assert not result.passed
    change_of = {hint: change for change, hint in FLOP_MISTAKES + BYTE_MISTAKES}
    made = next(change for hint, change in change_of.items() if words in hint)
    assert any(words in judged.hint for judged in result.failures), result.report(3)
    for case, judged in zip(task.cases(), result.cases):
        if not judged.passed and words not in judged.hint:
            model_name, _, requests = case.args
            assert judged.hint in change_of, (judged.call, judged.hint)
            assert step_variant(model_name, requests, **change_of[judged.hint]) == step_variant(
                model_name, requests, **made), (judged.call, judged.hint)


def test_a_head_count_error_is_not_told_about_attended_pairs():
    result = verdict("04_roofline", "step_intensity", learner_step(FLOPS=PARTS["FLOPS"].replace("num_heads", "num_kv_heads")))
    assert not any("attended pairs" in c.hint for c in result.failures), result.report(5)


def test_an_unknown_mistake_gets_the_whole_formula():
    result = verdict("04_roofline", "step_intensity", learner_step(FLOPS=PARTS["FLOPS"] + " + 12345"))
    assert all(c.hint.startswith("FLOPs = 2 x active_params") for c in result.failures), result.report(3)


# Exercise 09, tasks 2 and 3: a tie within the times' tolerance is judged on the learner's own times

RELOAD_IN_UNITS = """
    def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
        KV_AND_RELOAD
        tflop = 2 * model.active_params * tokens / 1e12
        if include_attention:
            tflop += 4 * model.num_layers * model.num_heads * model.head_dim * tokens * (tokens + 1) / 2 / 1e12
        recompute_s = tflop / (flops / 1e12)
        return {"decision": "reload" if reload_s DECIDE recompute_s else "recompute", "reload_s": reload_s,
                "recompute_s": recompute_s}
"""
IN_GB = """kv_gb = tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 / 1e9
        reload_s = kv_gb / (tier.bandwidth / 1e9) + tier.latency_s"""
PER_TOKEN = """seconds_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 / tier.bandwidth
        reload_s = tier.latency_s + seconds_per_token * tokens"""


@pytest.mark.parametrize("kv", [IN_GB, PER_TOKEN], ids=["in GB and TFLOP", "per token, in TFLOP"])
def test_reload_or_recompute_in_other_units_passes_the_exact_tie(kv):
    """In GB and TFLOP the tie is 2.9296875 s against 2.9296874999999996 s: the decision was rejected."""
    source = RELOAD_IN_UNITS.replace("KV_AND_RELOAD", kv).replace("DECIDE", "<=")
    result = verdict("09_serving_tradeoffs", "reload_or_recompute", source)
    assert result.passed, "\n".join(result.report())


def test_a_tie_that_goes_to_recompute_still_fails_where_the_learners_own_times_tie():
    source = """
        def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
            reload_s = tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 / tier.bandwidth + tier.latency_s
            work = 2 * model.active_params * tokens
            if include_attention:
                work += 4 * model.num_layers * model.num_heads * model.head_dim * tokens * (tokens + 1) / 2
            recompute_s = work / flops
            return {"decision": "reload" if reload_s < recompute_s else "recompute", "reload_s": reload_s,
                    "recompute_s": recompute_s}
    """
    result, caught = caught_mistake("09_serving_tradeoffs", source, "an exact tie")
    assert "a tie goes to reload" in caught[0].hint and "your own two times" in caught[0].hint, caught[0].hint
    assert "'decision': 'reload'" in caught[0].expected


def test_the_fastest_scheme_at_a_tie_is_judged_on_the_learners_own_step_times():
    """BF16 and W4A16 on the A100's bf16 roof tie: a learner whose W4A16 time comes out an ulp below BF16's
    (forced here with a factor 1 - 2**-52, as another order of operations may round) rightly picks W4A16 by
    its own times; one who sends equal times to the later scheme still fails."""
    schemes = """
        def best_scheme(model, gpu, batch, context_len=1024):
            bytes_per_weight = {"BF16": 2, "W4A16": (4 + 16 / 128) / 8, "FP8-W8A8": 1}
            kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 * (context_len + 2) * batch
            linear = 2 * model.active_params * batch
            attention = 4 * model.num_layers * model.num_heads * model.head_dim * (context_len + 1) * batch
            step_s = {}
            for name, per_weight in bytes_per_weight.items():
                peak = gpu.fp8_flops if name == "FP8-W8A8" else gpu.bf16_flops
                if not peak:
                    step_s[name] = None
                    continue
                memory_s = (model.num_params * per_weight + kv_bytes) / (0.8 * gpu.hbm_bandwidth)
                if name == "W4A16":   # an ulp below BF16's on the same roof
                    compute_s = (linear + attention) / (0.5 * gpu.bf16_flops) * (1 - 2**-52)
                else:
                    compute_s = linear / (0.5 * peak) + attention / (0.5 * gpu.bf16_flops)
                step_s[name] = max(compute_s, memory_s) + 0.0005
            best = min((name for name, t in step_s.items() if t is not None), key=step_s.get)
            return {"best": best, "step_s": step_s}
    """
    result = verdict("09_serving_tradeoffs", "best_scheme", schemes)
    assert result.passed, "\n".join(result.report())
    later_on_ties = schemes.replace(" * (1 - 2**-52)", "").replace(
        "key=step_s.get", "key=lambda n: (step_s[n], -list(bytes_per_weight).index(n))")
    caught_mistake("09_serving_tradeoffs", later_on_ties, "a tie goes to BF16")


# Exercise 03: the last prompt token, the budget and max_num_seqs on their boundaries

def test_a_block_that_ends_just_before_the_last_token_can_hit():
    caught_mistake("03_scheduler", """
        def cached_prefix_tokens(block_hashes, cached, num_prompt_tokens, block_size):
            hits = 0
            for i, block_hash in enumerate(block_hashes):
                if (i + 1) * block_size >= num_prompt_tokens - 1 or block_hash not in cached:   # one token early
                    break
                hits += 1
            return hits * block_size
    """, "13 tokens: the last one alone")


PLAN = """
    def plan_step(running, waiting, budget, max_num_seqs, long_prefill_token_threshold=0):
        plan, cap = {}, long_prefill_token_threshold or float("inf")
        for request_id, tokens_left in running:
            if RUNNING_STOPS:
                break
            plan[request_id] = min(tokens_left, cap, budget)
            budget -= plan[request_id]
            AFTER_RUNNING
        seqs = len(running)
        for request_id, tokens_left in waiting:
            if WAITING_STOPS:
                break
            plan[request_id] = min(tokens_left, cap, budget)
            budget -= plan[request_id]
            seqs += 1
        return plan
"""
RIGHT_PLAN = {"RUNNING_STOPS": "budget <= 0", "AFTER_RUNNING": "pass",
              "WAITING_STOPS": "budget <= 0 or seqs >= max_num_seqs"}


def plan_with(**changed: str) -> str:
    source = PLAN
    for part, text in {**RIGHT_PLAN, **changed}.items():
        source = source.replace(part, text)
    return source


def test_the_plan_written_this_way_passes():
    result = verdict("03_scheduler", "plan_step", plan_with())
    assert result.passed, "\n".join(result.report())


@pytest.mark.parametrize("change, case, hint", [
    ({"RUNNING_STOPS": "budget <= 0 or len(plan) >= max_num_seqs"}, "none is starved", "got nothing while budget"),
    ({"AFTER_RUNNING": "if plan[request_id] < tokens_left: break"}, "a capped prefill does not end",
     "got nothing while budget"),
    ({"WAITING_STOPS": "budget < 0 or seqs >= max_num_seqs"}, "spent exactly at the end of a prompt", "no entry"),
    ({"WAITING_STOPS": "budget <= 0 or seqs > max_num_seqs"}, "already fill max_num_seqs", "max_num_seqs"),
], ids=["running capped by max_num_seqs", "break after a capped prefill", "budget < 0", "seqs > max_num_seqs"])
def test_each_boundary_of_plan_step_catches_its_off_by_one(change, case, hint):
    result, caught = caught_mistake("03_scheduler", plan_with(**change), case)
    assert hint in caught[0].hint, caught[0].hint


def test_serving_running_requests_shortest_first_starves_the_long_one():
    """The gap issue 30 names: a running request the plan starves. Served shortest first but returned in queue
    order, it passed every case (no case had the budget run out on a running request before a shorter one)."""
    source = plan_with().replace("for request_id, tokens_left in running:",
                                 "for request_id, tokens_left in sorted(running, key=lambda r: r[1]):").replace(
        "        return plan", "        order = [r for r, _ in running] + [r for r, _ in waiting]\n"
                              "        return {r: plan[r] for r in order if r in plan}")
    result, caught = caught_mistake("03_scheduler", source, "serving the shortest first would starve")
    assert "never starved for shorter ones" in caught[0].hint, caught[0].hint


# Hints elsewhere that named one mistake for another

def test_kv_bytes_without_dtype_bytes_is_not_told_only_about_keys_and_values():
    result = verdict("01_paging", "kv_bytes_per_token", """
        def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
            return 2 * num_layers * num_kv_heads * head_dim   # dtype_bytes forgotten: right in fp8 only
    """)
    assert not result.passed
    assert all("one of the two factors 2 is missing" in c.hint for c in result.failures), result.report(3)


def test_kv_bytes_without_the_value_half_is_told_about_keys_and_values():
    result = verdict("01_paging", "kv_bytes_per_token", """
        def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
            return num_layers * num_kv_heads * head_dim * dtype_bytes
    """)
    assert all("a key AND a value" in c.hint for c in result.failures), result.report(3)


def test_recompute_with_kv_heads_in_attention_is_told_about_query_heads():
    result = verdict("09_serving_tradeoffs", "reload_or_recompute", """
        def reload_or_recompute(model, tokens, tier, flops, include_attention=False):
            kv_bytes = tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
            reload_s = kv_bytes / tier.bandwidth + tier.latency_s
            work = 2 * model.active_params * tokens
            if include_attention:
                work += 4 * model.num_layers * model.num_kv_heads * model.head_dim * tokens * (tokens + 1) / 2
            recompute_s = work / flops
            return {"decision": "reload" if reload_s <= recompute_s else "recompute", "reload_s": reload_s,
                    "recompute_s": recompute_s}
    """)
    assert not result.passed
    hints = {c.hint for c in result.failures if "recompute_s" in c.expected}
    assert hints and all("count the query heads, model.num_heads" in hint for hint in hints), hints


# Exercise 06, task 3: the ties are exact however the costs are computed

RING_TREE_FORMULATIONS = {
    "as written": (lambda n, b, a, beta: 2 * (n - 1) * a + 2 * (n - 1) / n * b * beta,
                   lambda n, b, a, beta: 2 * math.log2(n) * a + 4 * b * beta),
    "factored": (lambda n, b, a, beta: 2 * (n - 1) * (a + b / n * beta),
                 lambda n, b, a, beta: 2 * (math.log2(n) * a + 2 * b * beta)),
    "in microseconds": (lambda n, b, a, beta: 2 * (n - 1) * (a * 1e6) + 2 * (n - 1) / n * b * (beta * 1e6),
                        lambda n, b, a, beta: 2 * math.log2(n) * (a * 1e6) + 4 * b * (beta * 1e6)),
    "bandwidth, not beta": (lambda n, b, a, beta: 2 * (n - 1) * a + 2 * (n - 1) * b / (n / beta),
                            lambda n, b, a, beta: 2 * math.log2(n) * a + 4 * b / (1 / beta)),
}


def test_ring_and_tree_ties_stay_ties_in_every_formulation():
    task = Checker("06_ring_vs_tree").tasks["faster_algorithm"]
    ties = [case for case in task.cases() if "tie" in case.why]
    assert len(ties) == 2
    for case in ties:
        for name, (ring, tree) in RING_TREE_FORMULATIONS.items():
            assert ring(*case.args) == tree(*case.args), (name, case.args)


# Exercise 01, task 2: whole blocks, from a float utilisation

BLOCK_FORMULATIONS = {
    "as written": lambda mem, util, w, a, block: (util * mem - w - a) // block,
    "subtract the sum": lambda mem, util, w, a, block: (util * mem - (w + a)) // block,
    "divide, then floor": lambda mem, util, w, a, block: math.floor((mem * util - w - a) / block),
    "in GiB": lambda mem, util, w, a, block: math.floor((util * mem / 2**30 - w / 2**30 - a / 2**30) / (block / 2**30)),
    "in GB": lambda mem, util, w, a, block: math.floor((util * mem / 1e9 - w / 1e9 - a / 1e9) / (block / 1e9)),
}


def test_whole_blocks_are_the_same_in_every_formulation_and_no_case_is_near_a_whole_number():
    task = Checker("01_paging").tasks["kv_blocks_available"]
    for case in task.cases():
        expected = task.reference(*case.args)
        mem, util, w, a, block = case.args
        left = (util * mem - w - a) / block
        if left > 0 and case.why != "exactly 4 blocks are left":
            assert min(left % 1, 1 - left % 1) > 0.004, case
        for name, blocks in BLOCK_FORMULATIONS.items():
            assert max(0, int(blocks(*case.args))) == expected, (name, case)


def test_rounding_to_the_nearest_block_fails_on_one_byte_short():
    caught_mistake("01_paging", """
        def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
            return max(0, round((gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes) / block_bytes))
    """, "one byte short")


def test_no_other_roofline_case_comes_within_a_millionth_of_the_ridge():
    """What the task text promises: only the tie sits on the ridge point; every other decision is clear."""
    from course_lib.perf.roofline import ridge_point
    for case in Checker("04_roofline").tasks["step_intensity"].cases():
        if case.args[2] != TIE_AT_THE_RIDGE:
            share = roofline_step(*case.args)["intensity"] / ridge_point(get_gpu(case.args[1]))
            assert abs(share - 1) > 1e-6, case


@pytest.mark.parametrize("left, words", [
    ("gpu_memory_bytes - weight_bytes - activation_bytes", "multiply before subtracting"),
    ("gpu_memory_utilization * gpu_memory_bytes - activation_bytes", "subtract the weights too"),
    ("gpu_memory_utilization * gpu_memory_bytes - weight_bytes", "subtract the activation peak too"),
])
def test_a_block_budget_missing_one_term_is_told_which(left, words):
    result = verdict("01_paging", "kv_blocks_available", f"""
        def kv_blocks_available(gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_bytes, block_bytes):
            return max(0, int(({left}) // block_bytes))
    """)
    assert not result.passed and all(words in c.hint for c in result.failures), result.report(3)


def test_too_few_cached_tokens_is_told_how_many_blocks_may_hit():
    result, caught = caught_mistake("03_scheduler", """
        def cached_prefix_tokens(block_hashes, cached, num_prompt_tokens, block_size):
            hits = 0
            for block_hash in block_hashes[:num_prompt_tokens // block_size - 1]:   # one block short at 13 tokens
                if block_hash not in cached:
                    break
                hits += 1
            return hits * block_size
    """, "13 tokens: the last one alone")
    assert "(num_prompt_tokens - 1) // block_size = 3 blocks" in caught[0].hint, caught[0].hint
