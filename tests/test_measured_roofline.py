"""The real engine's steps on this machine's roofline: modelled work, measured time."""

import pytest

from course_lib.engine.llm import LLM
from course_lib.engine.measured_roofline import engine_model_spec, measure_engine_steps
from course_lib.perf.machine import measure_machine
from course_lib.perf.roofline import ridge_point


def test_the_engines_model_as_a_spec_counts_its_parameters():
    llm = LLM("tiny-llama", max_model_len=128)
    spec = engine_model_spec(llm)
    assert spec.num_params == sum(p.numel() for p in llm.model.parameters())
    assert 2.4e6 < spec.num_params < 2.5e6  # tiny-llama: 2.46 M parameters
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (6, 6, 2, 32)


def test_measured_steps_carry_real_times_and_the_models_work():
    machine = measure_machine(quick=True).as_gpu()
    seen = []
    points = measure_engine_steps({"model": "tiny-llama"}, machine, prompt_lengths=(8, 64), batch_sizes=(1, 4),
                                  context_len=16, repeats=2, on_step=seen.append)
    assert seen == [0, 1, 2, 3]
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
