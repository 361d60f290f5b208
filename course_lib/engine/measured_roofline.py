"""The real engine's own steps placed on a roofline: measured times, FLOPs and bytes from the model.

``measure_engine_roofline`` measures one core of this machine's two roofs (``perf.machine``) and
times the engine's prefill steps of one prompt and decode steps of a batch, interleaved in rounds
(a copy, a matmul, then every step once), all as one core's CPU time (``perf.one_core``), and
keeps each timing's median over the rounds. Load on a shared machine then hits the roofs and the
steps alike and barely at all: CPU time leaves out the moments other programs had the core, and
one thread never waits for a second one that lost its core. A step's time is the whole
``LLM.step()`` (forward pass and sampling, with the scheduler's bookkeeping, a small share). Each
step is costed with ``roofline.step_cost`` on the model's shape (``engine_model_spec``), so a
point's height is the FLOP/s the step really reached. Steps are costed against the measured roofs
themselves (``AT_THE_ROOFS``: a big matmul's and a big copy's rates are already what this machine
reaches, and no fixed cost per step), so "compute-bound" means an intensity at or above the
measured ridge, and the gap between a point and the roof is everything the roofline leaves out.
Prefix caching is off, so every prefill computes its whole prompt.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.perf.machine import MachineRoofline, RoofProbes
from course_lib.perf.models import ModelSpec
from course_lib.perf.one_core import cpu_seconds, one_thread
from course_lib.perf.roofline import AT_THE_ROOFS, Efficiency, StepPoint, step_cost
from course_lib.perf.units import plural


def engine_model_spec(llm: LLM) -> ModelSpec:
    """The engine's model as a ``ModelSpec``: its shape, and its parameters counted."""
    c = llm.model.config
    return ModelSpec(f"the engine's model ({c.hidden_size}-wide, {c.num_hidden_layers} layers)", c.num_hidden_layers,
                     c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     float(sum(p.numel() for p in llm.model.parameters())), c.max_position_embeddings,
                     hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, vocab_size=c.vocab_size)


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(32, 127) for _ in range(length)]


@dataclass(frozen=True)
class MeasuredRoofline:
    """One core's measured roofs and the engine's steps on them, each step at its median time."""

    roofs: MachineRoofline
    prefills: dict[int, StepPoint]  # prompt length -> its prefill step
    decodes: dict[int, StepPoint]  # batch size -> its decode step

    @property
    def points(self) -> list[StepPoint]:
        """Every step: the prefills by prompt length, then the decodes by batch size."""
        return list(self.prefills.values()) + list(self.decodes.values())

    def share_of_matmul_roof(self, point: StepPoint) -> float:
        """The step's achieved FLOP/s over the measured matmul rate."""
        return point.achieved_flops / self.roofs.flops

    def summary(self) -> str:
        """What the points show, computed from them (plain text): the prefills' share of the matmul
        roof at each end of the prompt lengths, the step with the largest share, and the largest
        decode batch's time against batch 1's."""
        (short, first), (long, last) = min(self.prefills.items()), max(self.prefills.items())
        (one, single), (many, biggest) = min(self.decodes.items()), max(self.decodes.items())
        share = self.share_of_matmul_roof
        top = max(self.points, key=share)
        return (f"Prefill: {share(first):.0%} of the matmul roof at {plural(short, 'token')}, {share(last):.0%} at "
                f"{plural(long, 'token')} ({share(last) / share(first):.1f} times the share). Largest share of any "
                f"step: the {top.label.removeprefix('measured ')} ({share(top):.0%}). Decode: a batch of {many} took "
                f"{biggest.time_s / single.time_s:.1f} times as long as a batch of {one}, for {many // one} times "
                f"the tokens.")


def measure_engine_roofline(llm_settings: dict, prompt_lengths=(16, 64, 256, 512), batch_sizes=(1, 4, 16, 32),
                            context_len: int = 64, repeats: int = 5, dtype: str = "fp32",
                            efficiency: Efficiency = AT_THE_ROOFS, quick_roofs: bool = False,
                            on_round=None) -> MeasuredRoofline:
    """One core's roofs and a fresh ``LLM(**llm_settings)``'s steps, in ``repeats`` interleaved
    rounds: one prefill per prompt length, one decode step per batch size (each sequence
    ``context_len`` tokens in). Returns the roofs (medians) and the steps (median times) as
    ``StepPoint``s costed on ``roofs.as_gpu()`` at ``efficiency``. ``quick_roofs`` times a smaller
    copy and product (``RoofProbes.sized(quick=True)``). ``on_round(i)`` reports each round done."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats!r}.")
    started = time.perf_counter()
    llm = LLM(**{"max_num_batched_tokens": max(max(prompt_lengths), max(batch_sizes) * context_len),
                 "max_num_seqs": max(batch_sizes), "max_model_len": max(max(prompt_lengths), context_len + 2),
                 **llm_settings, "enable_prefix_caching": False})
    rng = random.Random(0)
    copies, products = [], []
    prefills = {n: [] for n in prompt_lengths}
    decodes = {b: [] for b in batch_sizes}
    with one_thread():
        probes = RoofProbes.sized(quick_roofs)
        for round_index in range(repeats):
            copies.append(probes.copy_rate())
            products.append(probes.matmul_rate())
            for length in prompt_lengths:
                prefills[length].append(_time_prefill(llm, _prompt(rng, length)))
            for batch in batch_sizes:
                decodes[batch].append(_time_decode(llm, [_prompt(rng, context_len) for _ in range(batch)]))
            if on_round is not None:
                on_round(round_index)
    roofs = probes.roofline(copies, products, time.perf_counter() - started)
    machine, spec = roofs.as_gpu(), engine_model_spec(llm)
    return MeasuredRoofline(roofs, {
        length: StepPoint("prefill", f"measured prefill of {plural(length, 'token')}",
                          step_cost(spec, machine, [(0, length)], dtype, efficiency), statistics.median(prefills[length]))
        for length in prompt_lengths}, {
        batch: StepPoint("decode", f"measured decode, batch {batch:,} at {context_len:,} tokens of context",
                         step_cost(spec, machine, [(context_len, 1)] * batch, dtype, efficiency),
                         statistics.median(decodes[batch])) for batch in batch_sizes})


def _time_prefill(llm: LLM, prompt: list[int]) -> float:
    """One step that computes the whole prompt (the token budget covers it); its CPU seconds."""
    llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    return cpu_seconds(llm.step)


def _time_decode(llm: LLM, prompts: list[list[int]]) -> float:
    """Prefill every prompt in one step (not timed), then time one decode step of the whole batch."""
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for prompt in prompts:
        llm.add_request(prompt, params)
    llm.step()
    seconds = cpu_seconds(llm.step)
    if llm.scheduler.has_unfinished_requests():
        raise RuntimeError("The decode batch did not finish in one decode step; the engine's settings changed "
                           "how it schedules: give it the token budget and sequences for the whole batch.")
    return seconds

