"""Serving benchmark: this engine (continuous and static batching) against transformers.

    python -m course_lib.engine.benchmark            # 256 requests, 3 repeats, ~10 minutes on 2 cores
    python -m course_lib.engine.benchmark --requests 64 --repeats 1   # a quick look

Same weights (the shipped tiny model, exported to a Hugging Face ``LlamaForCausalLM``), same
workload: prompts of 32-256 tokens of Python's help text, output lengths drawn from an
exponential distribution (mean 64, capped at 256) with EOS ignored, 32 sequences at a time.
Prints useful output tokens per second (median over repeats), the ratios, the engine's
bookkeeping share of step time, and whether all three produced the same tokens.
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
from course_lib.models.loader import load_model, save_pretrained
from course_lib.models.train import corpus


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
    args = parser.parse_args()
    from transformers import LlamaForCausalLM as HFLlama

    model, _ = load_model("tiny-llama", dtype=torch.float32)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder, dtype=torch.float32)
        hf_model = HFLlama.from_pretrained(folder, torch_dtype=torch.float32).eval()
    workload = make_workload(args.requests)
    print(f"{args.requests} requests, {workload.output_tokens} output tokens, {torch.get_num_threads()} threads",
          flush=True)
    runs = {"engine, continuous batching": [], "engine, static batching": [], "transformers generate, static": []}
    outputs, overheads = {}, []
    for repeat in range(args.repeats):
        for name in runs:  # interleaved, so machine noise hits all three alike
            if name.startswith("transformers"):
                tokens, seconds = run_transformers(hf_model, workload)
            else:
                tokens, seconds, overhead = run_engine(model, workload, name.split(", ")[1].split()[0])
                if "continuous" in name:
                    overheads.append(overhead)
            runs[name].append(workload.output_tokens / seconds)
            outputs[name] = tokens
            print(f"  repeat {repeat + 1}: {name:32} {runs[name][-1]:8.0f} tok/s", flush=True)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    a, b, c = medians.values()
    print("\nmedian output tokens per second")
    for name, value in medians.items():
        print(f"  {name:32} {value:8.0f}")
    print(f"continuous / transformers (a/c): {a / c:.2f}x")
    print(f"continuous / static engine (a/b): {a / b:.2f}x")
    print(f"engine bookkeeping (scheduler + KV manager + input preparation): "
          f"{100 * statistics.median(overheads):.1f}% of step time")
    reference = outputs["engine, continuous batching"]
    for name, tokens in outputs.items():
        same = sum(x == y for x, y in zip(tokens, reference))
        print(f"  identical to continuous batching: {name:32} {same}/{len(reference)} requests")


if __name__ == "__main__":
    main()
