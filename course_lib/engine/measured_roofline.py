"""The real engine's own steps placed on a roofline: measured times, FLOPs and bytes from the model.

``measure_engine_steps(llm)`` times prefill steps of one prompt and decode steps of a batch on
the engine as it runs (the step's ``model_time_s``: forward pass and sampling, without the
scheduler's bookkeeping), and costs each step with ``roofline.step_cost`` on the model's
shape (``engine_model_spec``), so a point's height is the FLOP/s the step really reached.
Steps are costed against the measured roofs themselves (``AT_THE_ROOFS``: a big matmul's and a
big copy's rates are already what this machine reaches, and no fixed cost per step), so
"compute-bound" means an intensity at or above the measured ridge, and the gap between a
point and the roof is everything the roofline leaves out. Prefix caching is off, so every
prefill computes its whole prompt.
"""

from __future__ import annotations

import random

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.perf.hardware import GPU
from course_lib.perf.models import ModelSpec
from course_lib.perf.roofline import AT_THE_ROOFS, Efficiency, StepPoint, step_cost


def engine_model_spec(llm: LLM) -> ModelSpec:
    """The engine's model as a ``ModelSpec``: its shape, and its parameters counted."""
    c = llm.model.config
    return ModelSpec(f"the engine's model ({c.hidden_size}-wide, {c.num_hidden_layers} layers)", c.num_hidden_layers,
                     c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     float(sum(p.numel() for p in llm.model.parameters())), c.max_position_embeddings,
                     hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, vocab_size=c.vocab_size)


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(32, 127) for _ in range(length)]


def measure_engine_steps(llm_settings: dict, machine: GPU, prompt_lengths=(16, 64, 256, 512),
                         batch_sizes=(1, 4, 16, 32), context_len: int = 64, repeats: int = 3,
                         dtype: str = "fp32", efficiency: Efficiency = AT_THE_ROOFS,
                         on_step=None) -> list[StepPoint]:
    """Best-of-``repeats`` step times of a fresh ``LLM(**llm_settings)``: one prefill per prompt
    length, one decode step per batch size (each sequence ``context_len`` tokens in), as
    ``StepPoint``s costed on ``machine`` (a ``MachineRoofline.as_gpu()``) at ``efficiency``. ``on_step(i)`` reports
    progress over the ``len(prompt_lengths) + len(batch_sizes)`` measurements."""
    longest = max(max(prompt_lengths), max(batch_sizes) * context_len)
    llm = LLM(**{"max_num_batched_tokens": longest, "max_num_seqs": max(batch_sizes),
                 "max_model_len": max(max(prompt_lengths), context_len + repeats + 2),
                 **llm_settings, "enable_prefix_caching": False})
    spec, rng, points = engine_model_spec(llm), random.Random(0), []
    for i, length in enumerate(prompt_lengths):
        best = min(_time_prefill(llm, _prompt(rng, length)) for _ in range(repeats))
        cost = step_cost(spec, machine, [(0, length)], dtype, efficiency)
        points.append(StepPoint("prefill", f"measured prefill of {length:,} tokens", cost, best))
        if on_step is not None:
            on_step(i)
    for j, batch in enumerate(batch_sizes):
        best = _time_decode(llm, [_prompt(rng, context_len) for _ in range(batch)], repeats)
        cost = step_cost(spec, machine, [(context_len, 1)] * batch, dtype, efficiency)
        points.append(StepPoint("decode", f"measured decode, batch {batch} at {context_len} tokens of context",
                                cost, best))
        if on_step is not None:
            on_step(len(prompt_lengths) + j)
    return points


def _time_prefill(llm: LLM, prompt: list[int]) -> float:
    llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    llm.step()  # the whole prompt in one step: the budget covers it
    return llm.step_trace[-1].model_time_s


def _time_decode(llm: LLM, prompts: list[list[int]], repeats: int) -> float:
    """Prefill every prompt in one step, then time ``repeats`` decode steps of the whole batch."""
    params = SamplingParams(temperature=0, max_tokens=repeats + 1, ignore_eos=True)
    for prompt in prompts:
        llm.add_request(prompt, params)
    llm.step()
    times = []
    while llm.scheduler.has_unfinished_requests():
        llm.step()
        times.append(llm.step_trace[-1].model_time_s)
    return min(times)
