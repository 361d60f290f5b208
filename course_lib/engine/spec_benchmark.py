"""Speculative decoding benchmark: the shipped tiny model on the CPU, without drafts, with n-gram
prompt lookup and with the shipped draft model, at k = 2 and 4.

    python -m course_lib.engine.spec_benchmark            # 1, 4 and 32 concurrent requests, 3 repeats
    python -m course_lib.engine.spec_benchmark --quick    # a few seconds: the smoke test

Prompts are slices of Python's help text (the training corpus, which repeats itself enough for
n-gram lookup to find matches); outputs are greedy, EOS ignored. Every run is timed on one core
as CPU time (``perf.one_core``: PyTorch on one thread, that thread's CPU seconds), so the time
other programs had the core does not count, and all configurations run interleaved in one
process, so what load remains (shared memory bus and caches) hits them alike. The table shows
medians, the ratio of each to "off" at the same concurrency, acceptance per draft position, and
tokens per verification step measured against (1 - a^(k+1)) / (1 - a) from the measured
conditional acceptance a. "same" says whether every output equals the run without drafts.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

import torch

from course_lib.engine.llm import LLM
from course_lib.engine.metrics import SpecDecodeStats
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.corpus import corpus
from course_lib.models.loader import load_model
from course_lib.perf.one_core import cpu_seconds, one_thread
from course_lib.perf.units import format_speedup, plural


def make_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    text = corpus()[0].tolist()
    starts = [rng.randrange(len(text) - length) for _ in range(count)]
    return [text[s:s + length] for s in starts]


METHODS = ("ngram", "draft_model")


def configs(ks: list[int], methods: tuple[str, ...] = METHODS) -> dict[str, dict | None]:
    """"off", then each proposer method at each k, as speculative configs by name."""
    out: dict[str, dict | None] = {"off": None}
    if "ngram" in methods:
        for k in ks:
            out[f"ngram k={k}"] = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 4}
    if "draft_model" in methods:
        for k in ks:
            out[f"draft k={k}"] = {"method": "draft_model", "model": "tiny-llama-draft", "num_speculative_tokens": k}
    return out


def run_once(model, draft, prompts: list[list[int]], max_tokens: int, spec: dict | None):
    """(outputs, CPU seconds, stats) for one engine run of all prompts at once; call it inside
    ``one_thread()`` for one core's time."""
    if spec is not None and spec["method"] == "draft_model":
        spec = {**spec, "model": draft}
    llm = LLM(model, max_num_seqs=len(prompts), max_num_batched_tokens=2048, max_model_len=512,
              enable_prefix_caching=False, speculative_config=spec)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = []
    seconds = cpu_seconds(lambda: outs.extend(llm.generate(prompts, params, use_tqdm=False)))
    return [o.outputs[0].token_ids for o in outs], seconds, llm.spec_decode_stats


@dataclass(frozen=True)
class BenchmarkRow:
    """One configuration at one concurrency: medians over the interleaved repeats."""

    concurrency: int
    config: str
    tokens_per_s: float  # output tokens per CPU second of one core
    vs_off: float  # tokens_per_s / the "off" run's, at the same concurrency
    stats: SpecDecodeStats | None  # of the last repeat (the same tokens every repeat: greedy)
    same_as_off: bool  # every output equals the run without drafts


def benchmark(concurrencies: list[int], ks: list[int], repeats: int = 3, max_tokens: int = 64, prompt_len: int = 128,
              methods: tuple[str, ...] = METHODS, warm_up: bool = True, on_run=None) -> list[BenchmarkRow]:
    """Every configuration of ``configs(ks, methods)`` at every concurrency, interleaved ``repeats``
    times. ``on_run(i)`` reports progress over the ``len(concurrencies) x repeats x configurations``
    runs (``num_runs`` counts them)."""
    model, _ = load_model("tiny-llama", dtype=torch.float32)
    draft, _ = load_model("tiny-llama-draft", dtype=torch.float32)
    table = configs(ks, methods)
    rows, runs = [], 0
    with one_thread():
        for spec in table.values() if warm_up else ():  # warm up torch's kernels and allocator, unmeasured
            run_once(model, draft, make_prompts(2, prompt_len), 4, spec)
        for concurrency in concurrencies:
            prompts = make_prompts(concurrency, prompt_len, seed=concurrency)
            rates: dict[str, list[float]] = {name: [] for name in table}
            stats, outputs = {}, {}
            for _ in range(repeats):
                for name, spec in table.items():  # interleaved
                    tokens, seconds, spec_stats = run_once(model, draft, prompts, max_tokens, spec)
                    rates[name].append(concurrency * max_tokens / seconds)
                    stats[name], outputs[name] = spec_stats, tokens
                    if on_run is not None:
                        on_run(runs)
                    runs += 1
            base = statistics.median(rates["off"])
            rows += [BenchmarkRow(concurrency, name, statistics.median(rates[name]),
                                  statistics.median(rates[name]) / base, stats[name], outputs[name] == outputs["off"])
                     for name in table]
    return rows


def num_runs(concurrencies: list[int], ks: list[int], repeats: int = 3, methods: tuple[str, ...] = METHODS) -> int:
    """How many engine runs ``benchmark`` makes with these settings (the warm-up aside)."""
    return len(concurrencies) * repeats * len(configs(ks, methods))


def format_rows(rows: list[BenchmarkRow]) -> str:
    """The benchmark as a text table: acceptance per draft position, and measured tokens per
    verification step beside (1 - a^(k+1)) / (1 - a) from the measured conditional acceptance."""
    lines = [f"{'conc':>4} {'config':<11} {'tok/s':>7} {'vs off':>6} {'accept per position':<24} "
             f"{'tok/step':>8} {'pred':>5} same"]
    for r in rows:
        s = r.stats
        per_pos = " ".join(f"{a:.2f}" for a in s.acceptance_rate_per_pos) if s else "-"
        measured = f"{s.mean_tokens_per_step:.2f}" if s else "-"
        predicted = f"{s.predicted_tokens_per_step():.2f}" if s else "-"
        lines.append(f"{r.concurrency:>4} {r.config:<11} {r.tokens_per_s:7.0f} {r.vs_off:5.2f}x "
                     f"{per_pos:<24} {measured:>8} {predicted:>5} {'yes' if r.same_as_off else 'NO'}")
    return "\n".join(lines)


def verdicts(rows: list[BenchmarkRow]) -> str:
    """Every speculating configuration against "off" at its concurrency, in words, computed from
    the medians: 'Tokens per second against no drafts: at 1 request, draft k=4 1.13x faster; ...'."""
    return "Tokens per second against no drafts: " + "; ".join(
        f"at {plural(r.concurrency, 'request')}, {r.config} {format_speedup(r.vs_off)}" for r in rows if r.config != "off")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="tiny run (1 and 4 requests, 8 tokens, 1 repeat)")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.k, args.repeats, args.max_tokens, args.prompt_len = [1, 4], [2], 1, 8, 32
    print(f"tiny-llama on one CPU core (tokens per CPU second of one thread); prompts of {args.prompt_len} tokens, "
          f"{args.max_tokens} greedy output tokens each; medians of {args.repeats} interleaved repeats", flush=True)
    rows = benchmark(args.concurrency, args.k, args.repeats, args.max_tokens, args.prompt_len, warm_up=not args.quick)
    print("\n" + format_rows(rows) + "\n" + verdicts(rows))


if __name__ == "__main__":
    main()
