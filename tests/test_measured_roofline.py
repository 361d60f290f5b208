"""The real engine's steps on this machine's roofline: modelled work, measured time."""

import pytest

from course_lib.engine.llm import LLM
from course_lib.engine.measured_roofline import MeasuredRoofline, engine_model_spec, measure_engine_roofline
from course_lib.perf.machine import MachineRoofline
from course_lib.perf.models import get_model
from course_lib.perf.roofline import AT_THE_ROOFS, StepPoint, ridge_point, step_cost


def test_the_engines_model_as_a_spec_counts_its_parameters():
    llm = LLM("tiny-llama", max_model_len=128)
    spec = engine_model_spec(llm)
    assert spec.num_params == sum(p.numel() for p in llm.model.parameters())
    assert 2.4e6 < spec.num_params < 2.5e6  # tiny-llama: 2.46 M parameters
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (6, 6, 2, 32)


def test_measured_steps_carry_real_times_and_the_models_work():
    seen = []
    measured = measure_engine_roofline({"model": "tiny-llama"}, prompt_lengths=(8, 64), batch_sizes=(1, 4),
                                       context_len=16, repeats=2, quick_roofs=True, on_round=seen.append)
    machine, points = measured.roofs.as_gpu(), measured.points
    assert seen == [0, 1] and measured.roofs.threads == 1
    assert [p.phase for p in points] == ["prefill", "prefill", "decode", "decode"]
    assert all(p.measured_s > 0 and p.time_s == p.measured_s for p in points)
    prefill_8, prefill_64 = points[0].cost, points[1].cost
    assert prefill_64.flops > 7 * prefill_8.flops  # FLOPs grow with the prompt; the weights are read once
    assert prefill_64.arithmetic_intensity > prefill_8.arithmetic_intensity
    assert points[0].achieved_flops == pytest.approx(prefill_8.flops / points[0].measured_s)
    # costed against the measured roofs themselves: their ridge decides the label, no fixed cost is added
    for point in points:
        assert point.cost.overhead_s == 0 and point.cost.compute_s == pytest.approx(point.cost.flops / machine.bf16_flops)
        assert point.cost.bound == ("compute" if point.cost.arithmetic_intensity >= ridge_point(machine) else "memory")


def test_the_steps_are_medians_of_interleaved_rounds_timed_in_cpu_time(monkeypatch):
    """A loaded Run All once timed a 16-token prefill at 261 ms and a 512-token one at 96 ms (best of
    three, wall clock, two threads): rounds now interleave the roofs with the steps, every timing
    is one core's CPU time, and each figure is the median of the rounds."""
    from course_lib.engine import measured_roofline

    order = []
    # per round: the 8-token prefill, the 16-token one, the decode; each sees 10 s once, as if disturbed
    clock = iter([10.0, 0.001, 0.002, 0.001, 0.002, 10.0, 0.002, 10.0, 0.001])
    monkeypatch.setattr(measured_roofline, "cpu_seconds", lambda run: (order.append(run.__name__), run(),
                                                                        next(clock))[-1])
    measured = measure_engine_roofline({"model": "tiny-llama"}, prompt_lengths=(8, 16), batch_sizes=(1,),
                                       context_len=8, repeats=3, quick_roofs=True)
    assert order == ["step"] * 9  # three rounds of two prefills and one decode, each timed once
    assert [p.time_s for p in measured.points] == [0.002, 0.002, 0.002]  # the one 10 s outlier never shows


def test_the_summary_is_computed_from_the_points():
    roofs = MachineRoofline("a CPU", 100e9, 10e9, 2048, 1 << 28, 1, 1.0)
    machine, model = roofs.as_gpu(), get_model("Llama-3.2-1B")
    point = lambda phase, label, requests, seconds: StepPoint(  # noqa: E731
        phase, label, step_cost(model, machine, requests, "fp32", AT_THE_ROOFS), seconds)
    prefills = {16: point("prefill", "measured prefill of 16 tokens", [(0, 16)], 1.0),
                512: point("prefill", "measured prefill of 512 tokens", [(0, 512)], 2.0)}
    decodes = {1: point("decode", "measured decode, batch 1", [(64, 1)], 0.01),
               32: point("decode", "measured decode, batch 32", [(64, 1)] * 32, 0.03)}
    measured = MeasuredRoofline(roofs, prefills, decodes)
    shares = [measured.share_of_matmul_roof(p) for p in prefills.values()]
    text = measured.summary()
    assert f"Prefill: {shares[0]:.0%} of the matmul roof at 16 tokens, {shares[1]:.0%} at 512 tokens" in text
    assert f"({shares[1] / shares[0]:.1f} times the share)" in text
    top = max(measured.points, key=measured.share_of_matmul_roof)
    assert f"Largest share of any step: the {top.label.removeprefix('measured ')}" in text
    assert "a batch of 32 took 3.0 times as long as a batch of 1, for 32 times the tokens" in text
