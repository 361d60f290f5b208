"""Serving benchmark: this engine (continuous and static batching) against transformers (continuous
batching with a paged KV cache, and static ``generate``).

    python -m course_lib.engine.benchmark            # 256 requests, 3 repeats, ~10 minutes on 2 cores
    python -m course_lib.engine.benchmark --requests 64 --repeats 1   # a quick look
    python -m course_lib.engine.benchmark --threads 1   # steadier when other work shares the cores

Same weights (the shipped tiny model, exported to a Hugging Face ``LlamaForCausalLM``), same
workload: prompts of 32-256 tokens of Python's help text, output lengths drawn from an
exponential distribution (mean 64, capped at 256) with EOS ignored, 32 sequences at a time.
Prints useful output tokens per second (median over repeats), the engine's ratio to each of the
others, the engine's bookkeeping share of step time, and whether all four produced the same tokens.
The engine runs its default attention backend (on a CPU, ``"cpu"``: the C++ decode kernel).

transformers' continuous batching (``ContinuousBatchingManager``, ``attn_implementation="sdpa"``)
gets the engine's limits: 32 requests and 2,048 tokens per batch, 16-token pages, as many pages
as the engine's KV blocks, no prefix sharing. Each request carries its own ``max_new_tokens``
(``add_request`` takes one per request), so nothing is generated past a request's length and
nothing is truncated; EOS is off (``eos_token_id=-1``). Its clock, like the engine's, starts at
the first request and stops at the last result, so building the manager and stopping its
thread are not counted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.corpus import corpus
from course_lib.models.loader import load_model, save_pretrained


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(num_requests: int = 256, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    text = corpus()[0].tolist()
    prompts, lens = [], []
    for _ in range(num_requests):
        length = rng.randint(32, 256)
        start = rng.randrange(len(text) - length)
        prompts.append(text[start:start + length])
        lens.append(min(256, max(1, round(rng.expovariate(1 / 64)))))
    return Workload(prompts, lens)


def run_engine(model, workload: Workload, policy: str, max_num_seqs: int = 32):
    """(outputs, seconds, bookkeeping share of step time) for one engine run."""
    llm = LLM(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048, max_model_len=512,
              scheduling_policy=policy, enable_prefix_caching=False)
    started = time.perf_counter()
    ids = [llm.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
           for p, n in zip(workload.prompts, workload.output_lens)]
    done = {}
    while llm.scheduler.has_unfinished_requests():
        done.update({r.request_id: r.output_token_ids for r in llm.step()})
    seconds = time.perf_counter() - started
    overhead = sum(r.overhead_time_s for r in llm.step_trace) / sum(r.wall_time_s for r in llm.step_trace)
    return [done[i] for i in ids], seconds, overhead


@torch.inference_mode()
def run_transformers_continuous(hf_model, workload: Workload, max_num_seqs: int = 32, block_size: int = 16,
                                max_model_len: int = 512):
    """(outputs, seconds): transformers' continuous batching, each request with its own length."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                                  max_new_tokens=max(workload.output_lens))
    batching = ContinuousBatchingConfig(max_requests_per_batch=max_num_seqs, max_batch_tokens=2048,
                                        page_size=block_size, num_blocks=max_num_seqs * max_model_len // block_size,
                                        allow_block_sharing=False)
    manager = hf_model.init_continuous_batching(generation_config=generation, continuous_batching_config=batching)
    manager.warmup()
    manager.start()
    try:
        started = time.perf_counter()
        ids = [manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=n, eos_token_id=-1)
               for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens))]
        done = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                done[result.request_id] = result.generated_tokens
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped before finishing.")
        seconds = time.perf_counter() - started
    finally:
        manager.stop(block=True, timeout=5)
        manager.destroy()
    return [done[i] for i in ids], seconds


@torch.inference_mode()
def run_transformers(hf_model, workload: Workload, batch_size: int = 32, pad_id: int = 0):
    """(outputs, seconds): static batches in arrival order, left-padded, run to the longest output."""
    outputs, started = [], time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first:first + batch_size]
        lens = workload.output_lens[first:first + batch_size]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        new = max(lens)
        generated = hf_model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, pad_token_id=pad_id, eos_token_id=None)
        outputs += [row[width:width + n].tolist() for row, n in zip(generated, lens)]
    return outputs, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own); 1 is steadier on a machine others share")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import LlamaForCausalLM as HFLlama

    model, _ = load_model("tiny-llama", dtype=torch.float32)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder, dtype=torch.float32)
        hf_model = HFLlama.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    workload = make_workload(args.requests)
    attention = LLM(model, max_model_len=512, enable_prefix_caching=False).attention_backend
    print(f"{args.requests} requests, {workload.output_tokens} output tokens, {torch.get_num_threads()} threads, "
          f"engine attention backend {attention!r}", flush=True)
    runs = {name: [] for name in ("engine, continuous batching", "engine, static batching",
                                  "transformers, continuous batching", "transformers generate, static")}

    def run(name: str, load: Workload):
        if name == "transformers, continuous batching":
            return *run_transformers_continuous(hf_model, load), None
        if name.startswith("transformers"):
            return *run_transformers(hf_model, load), None
        return run_engine(model, load, name.split(", ")[1].split()[0])

    for name in runs:  # a first call pays one-time set-up costs (seconds on a CPU): not in any repeat
        run(name, make_workload(4, seed=1))
    outputs, overheads = {}, []
    for repeat in range(args.repeats):
        for name in runs:  # interleaved, so machine noise hits all four alike
            tokens, seconds, overhead = run(name, workload)
            if name == "engine, continuous batching":
                overheads.append(overhead)
            runs[name].append(workload.output_tokens / seconds)
            outputs[name] = tokens
            print(f"  repeat {repeat + 1}: {name:34} {runs[name][-1]:8.0f} tok/s", flush=True)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    engine = medians["engine, continuous batching"]
    print("\nmedian output tokens per second, and the continuous engine's ratio to each")
    for name, value in medians.items():
        print(f"  {name:34} {value:8.0f}   engine / this: {engine / value:5.2f}x")
    print(f"engine bookkeeping (scheduler + KV manager + input preparation): "
          f"{100 * statistics.median(overheads):.1f}% of step time")
    reference = outputs["engine, continuous batching"]
    for name, tokens in outputs.items():
        same = sum(x == y for x, y in zip(tokens, reference))
        print(f"  identical to the continuous engine: {name:34} {same}/{len(reference)} requests")


if __name__ == "__main__":
    main()
