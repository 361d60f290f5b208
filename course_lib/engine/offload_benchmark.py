"""Reload or recompute: the time to first token of a prompt that comes back after its prefix left the GPU.

One scenario, three ways, on the shipped tiny model: serve a long prompt (a slice of its training
corpus), then another prompt as long, which pushes it out of a GPU pool that holds one such
request, then the long prompt again. The returning prompt's TTFT is measured with

  * ``"gpu hit"``: nothing evicted in between (the prefix cache's best case);
  * ``"cpu reload"``: the small pool with the KV offload tier on (``kv_offload_blocks``), so the
    evicted blocks are copied back from CPU memory and only the last block is computed;
  * ``"recompute"``: the small pool without it: the whole prompt is prefilled again.

The three run interleaved in one process, ``repeats`` times (after one warm-up), so the
machine's noise hits them alike; report medians. On the CPU it runs with one PyTorch thread
(``num_threads``, restored afterwards): on a shared 2-core machine, two threads waiting on each
other while another process holds a core made single steps 10-100x slower at random.
``python -m course_lib.engine.offload_benchmark [--prompt-tokens 256] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.corpus import corpus
from course_lib.models.loader import load_model

MODES = ("gpu hit", "cpu reload", "recompute")
FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


@dataclass
class ReturningPromptResult:
    """Per mode (``MODES``): the returning prompt's TTFTs in seconds (one per repeat), the prompt
    tokens it found in each tier and those it computed (from the last repeat), and its first token."""

    prompt_tokens: int
    ttft_s: dict[str, list[float]] = field(default_factory=dict)
    gpu_hit_tokens: dict[str, int] = field(default_factory=dict)
    cpu_hit_tokens: dict[str, int] = field(default_factory=dict)
    computed_tokens: dict[str, int] = field(default_factory=dict)
    first_token: dict[str, int] = field(default_factory=dict)

    @property
    def median_ttft_s(self) -> dict[str, float]:
        return {mode: statistics.median(times) for mode, times in self.ttft_s.items()}

    @property
    def reload_speedup(self) -> float:
        """Median recompute TTFT / median reload TTFT."""
        medians = self.median_ttft_s
        return medians["recompute"] / medians["cpu reload"]

    @property
    def same_first_token(self) -> bool:
        return len(set(self.first_token.values())) == 1

    def table(self) -> str:
        lines = [f"returning prompt of {self.prompt_tokens} tokens, median of {len(self.ttft_s[MODES[0]])} "
                 "interleaved repeats",
                 f"{'mode':<11} {'TTFT ms':>8} {'GPU hit':>8} {'CPU hit':>8} {'computed':>9}"]
        for mode in MODES:
            lines.append(f"{mode:<11} {1e3 * self.median_ttft_s[mode]:>8.2f} {self.gpu_hit_tokens[mode]:>8} "
                         f"{self.cpu_hit_tokens[mode]:>8} {self.computed_tokens[mode]:>9}")
        lines.append(f"reload is {self.reload_speedup:.1f}x faster than recompute; same first token: "
                     f"{self.same_first_token}")
        return "\n".join(lines)


def corpus_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` slices of ``length`` tokens of the tiny model's training text."""
    text = corpus()[0].tolist()
    rng = random.Random(seed)
    return [text[start:start + length] for start in (rng.randrange(len(text) - length) for _ in range(count))]


def _serve(model, mode: str, long_prompt: list[int], evicting: list[int], block_size: int
           ) -> tuple[float, int, int, int, int]:
    """One scenario: (returning TTFT s, GPU hit tokens, CPU hit tokens, computed tokens, first token)."""
    num_blocks = -(-len(long_prompt) // block_size)  # one prompt (the sampled token's KV is never written)
    llm = LLM(model, max_num_seqs=1, max_num_batched_tokens=num_blocks * block_size,
              max_model_len=num_blocks * block_size, block_size=block_size, num_gpu_blocks=num_blocks,
              kv_offload_blocks=num_blocks if mode == "cpu reload" else None)
    llm.generate([long_prompt], FIRST_TOKEN, use_tqdm=False)
    if mode != "gpu hit":
        llm.generate([evicting], FIRST_TOKEN, use_tqdm=False)  # takes every block: the long prompt's prefix is evicted
    stats = llm.kv_cache_manager.prefix_cache_stats
    gpu_before, cpu_before = stats.gpu_hit_tokens, stats.cpu_hit_tokens
    steps_before = len(llm.step_trace)
    again = llm.generate([long_prompt], FIRST_TOKEN, use_tqdm=False)[0]
    computed = sum(record.num_tokens for record in llm.step_trace[steps_before:])
    return (again.metrics[0].ttft, stats.gpu_hit_tokens - gpu_before, stats.cpu_hit_tokens - cpu_before,
            computed, again.outputs[0].token_ids[0])


def returning_prompt_ttft(prompt_tokens: int = 256, repeats: int = 3, block_size: int = 16, model=None,
                          seed: int = 0, progress: Callable[[str], None] | None = print,
                          num_threads: int | None = 1) -> ReturningPromptResult:
    """Measure the returning prompt's TTFT by mode (module docstring). The GPU pool holds exactly one
    request of ``prompt_tokens`` tokens; the offload tier as many blocks. ``model``: the shipped tiny
    model by default (CUDA in bf16 when available). ``progress`` gets one line per repeat (None: silent)."""
    if prompt_tokens < 2 * block_size:
        raise ValueError(f"prompt_tokens={prompt_tokens} is under two blocks of {block_size}; make it longer.")
    if model is None:
        cuda = torch.cuda.is_available()
        model, _ = load_model("tiny-llama", dtype=torch.bfloat16 if cuda else torch.float32,
                              device="cuda" if cuda else "cpu")
    threads = torch.get_num_threads()
    if num_threads and next(model.parameters()).device.type == "cpu":
        torch.set_num_threads(num_threads)
    try:
        return _measure(model, prompt_tokens, repeats, block_size, seed, progress)
    finally:
        torch.set_num_threads(threads)


def _measure(model, prompt_tokens: int, repeats: int, block_size: int, seed: int,
             progress: Callable[[str], None] | None) -> ReturningPromptResult:
    long_prompt, evicting = corpus_prompts(2, prompt_tokens, seed)
    result = ReturningPromptResult(prompt_tokens, {mode: [] for mode in MODES})
    _serve(model, "gpu hit", long_prompt, evicting, block_size)  # warm-up: first passes pay one-time costs
    for repeat in range(repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]  # neither mode always runs first
        for mode in order:
            ttft, gpu, cpu, computed, token = _serve(model, mode, long_prompt, evicting, block_size)
            result.ttft_s[mode].append(ttft)
            result.gpu_hit_tokens[mode], result.cpu_hit_tokens[mode] = gpu, cpu
            result.computed_tokens[mode], result.first_token[mode] = computed, token
        if progress is not None:
            progress(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
                f"{mode} {1e3 * result.ttft_s[mode][-1]:.1f} ms" for mode in MODES))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(returning_prompt_ttft(args.prompt_tokens, args.repeats).table())


if __name__ == "__main__":
    main()
