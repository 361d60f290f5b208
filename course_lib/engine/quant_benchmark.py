"""What each quantization scheme saves when the engine serves: decode speed, weight and KV bytes, the matmul that ran.

    python -m course_lib.engine.quant_benchmark                 # ~1-2 minutes on 2 cores
    python -m course_lib.engine.quant_benchmark --json benchmarks/results/quant_serving_2cpu.json

The same prompts (slices of the tiny model's training text) are served greedily with
``LLM("tiny-llama")`` in full precision and with each scheme (``ROWS``), in float32 and in
bfloat16: PyTorch's CPU kernels for int8 and int4 weights are vectorised for bfloat16 activations
only, so the float32 rows show dequantize + matmul and the bfloat16 rows show the real kernel, beside
``"int8 dequantize+matmul (reference)"`` (the same int8 model with ``kernel="torch"``) so that the
kernel's speedup is a ratio from one run. Every engine is built once; then ``repeats`` rounds
serve the prompts on each engine in turn (the order reversed every other round), so the machine's
noise hits them alike; medians are reported. Decode tokens/s counts only steps in which every
scheduled request decoded one token. On the CPU it runs with one PyTorch thread (``num_threads``),
as ``course_lib/engine/offload_benchmark.py`` does, for steadier timings on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from course_lib.engine.llm import LLM
from course_lib.engine.offload_benchmark import corpus_prompts
from course_lib.engine.sampling_params import SamplingParams
from course_lib.paths import RESULTS_DIR
from course_lib.quant.linear import QuantizedLinear, set_kernel_

REFERENCE = "int8 dequantize+matmul (reference)"
# (row name, LLM keyword arguments, int8 kernel to set afterwards or None)
ROWS = (("full precision", {}, None), ("int8", {"quantization": "int8"}, None),
        (REFERENCE, {"quantization": "int8"}, "torch"), ("int4", {"quantization": "int4"}, None),
        ("w8a8", {"quantization": "w8a8"}, None), ("fp8 KV cache", {"kv_cache_dtype": "fp8"}, None))
DTYPES = ("float32", "bfloat16")
COMMITTED = RESULTS_DIR / "quant_serving_2cpu.json"  # the run the README and lesson 09 quote


@dataclass
class SchemeRow:
    """One engine's measurements: decode tokens/s per round, the bytes it holds, the matmul paths its
    quantized layers took (empty for full precision), and the share of requests whose greedy tokens
    equal full precision's in the same dtype (``agreement``) and of tokens before the first difference."""

    dtype: str
    scheme: str
    decode_tok_s: list[float] = field(default_factory=list)
    weight_bytes: int = 0
    kv_bytes: int = 0
    matmul: str = ""
    agreement: float = 1.0
    prefix_agreement: float = 1.0

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.decode_tok_s)


@dataclass
class ServingResult:
    """All rows of one run and what it ran on."""

    rows: list[SchemeRow]
    machine: str
    threads: int
    prompts: int
    prompt_tokens: int
    output_tokens: int
    repeats: int

    def row(self, dtype: str, scheme: str) -> SchemeRow:
        return next(r for r in self.rows if r.dtype == dtype and r.scheme == scheme)

    def ratio(self, row: SchemeRow) -> float:
        """Median decode tokens/s over full precision's in the same dtype."""
        return row.median_tok_s / self.row(row.dtype, "full precision").median_tok_s

    def table(self) -> str:
        lines = [f"{self.prompts} prompts x {self.prompt_tokens} tokens, {self.output_tokens} greedy tokens each, "
                 f"median of {self.repeats} interleaved rounds, {self.threads} thread(s), {self.machine}",
                 f"{'dtype':<9} {'scheme':<35} {'decode tok/s':>12} {'vs full':>8} {'weights MB':>11} "
                 f"{'KV MB':>7} {'same output':>11}  matmul"]
        for r in self.rows:
            lines.append(f"{r.dtype:<9} {r.scheme:<35} {r.median_tok_s:>12.0f} {self.ratio(r):>7.2f}x "
                         f"{r.weight_bytes / 1e6:>11.2f} {r.kv_bytes / 1e6:>7.2f} {r.agreement:>11.2f}  "
                         f"{r.matmul or 'F.linear (full precision)'}")
        for dtype in DTYPES:
            if any(r.dtype == dtype and r.scheme == REFERENCE for r in self.rows):
                kernel, reference = self.row(dtype, "int8"), self.row(dtype, REFERENCE)
                ratio = kernel.median_tok_s / reference.median_tok_s
                lines.append(f"{dtype} int8: {kernel.matmul} is {ratio:.2f}x the decode speed of dequantize + matmul"
                             if kernel.matmul != reference.matmul else
                             f"{dtype} int8: both rows ran {kernel.matmul}, so their ratio, {ratio:.2f}x, is this "
                             "run's noise")
        return "\n".join(lines)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")


def load_result(path: str | Path = COMMITTED) -> ServingResult:
    """A result written by ``--json``; by default the committed one, which lesson 09 reads."""
    data = json.loads(Path(path).read_text())
    return ServingResult(**{**data, "rows": [SchemeRow(**row) for row in data["rows"]]})


def _engine(dtype: str, options: dict, kernel: str | None, max_len: int, num_prompts: int) -> LLM:
    llm = LLM("tiny-llama", dtype=dtype, max_model_len=max_len, max_num_seqs=num_prompts,
              enable_prefix_caching=False, **options)
    if kernel is not None:
        set_kernel_(llm.model, kernel, options["quantization"])
    return llm


def _decode_rate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list[list[int]]]:
    """(decode tokens/s of one generate call, its greedy tokens)."""
    first = len(llm.step_trace)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    decode = [r for r in llm.step_trace[first:] if r.scheduled and all(n == 1 for n in r.scheduled.values())]
    rate = sum(r.num_tokens for r in decode) / sum(r.wall_time_s for r in decode)
    return rate, [o.outputs[0].token_ids for o in outputs]


def _agreement(tokens: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """(share of identical sequences, mean share of tokens before the first difference)."""
    same = sum(a == b for a, b in zip(tokens, reference)) / len(reference)
    prefix = []
    for a, b in zip(tokens, reference):
        length = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(length / len(b))
    return same, statistics.mean(prefix)


def measure(prompts: int = 4, prompt_tokens: int = 24, output_tokens: int = 32, repeats: int = 3,
            dtypes: tuple[str, ...] = DTYPES, rows=ROWS, progress: Callable[[str], None] | None = print,
            num_threads: int | None = 1, seed: int = 0) -> ServingResult:
    """Serve the prompts on every (dtype, row) engine, interleaved (module docstring)."""
    threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        texts = corpus_prompts(prompts, prompt_tokens, seed)
        params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
        engines, results = {}, []
        for dtype in dtypes:
            for name, options, kernel in rows:
                if progress is not None:
                    progress(f"building {dtype} {name}")
                llm = _engine(dtype, options, kernel, prompt_tokens + output_tokens, prompts)
                _decode_rate(llm, texts[:1], SamplingParams(temperature=0, max_tokens=2))  # warm-up
                engines[dtype, name] = llm
                weights = sum(t.numel() * t.element_size() for t in (*llm.model.parameters(), *llm.model.buffers()))
                results.append(SchemeRow(dtype, name, weight_bytes=weights, kv_bytes=llm.kv_cache_bytes.target_bytes))
        tokens = {}
        for repeat in range(repeats):
            order = results if repeat % 2 == 0 else results[::-1]
            for row in order:
                rate, tokens[row.dtype, row.scheme] = _decode_rate(engines[row.dtype, row.scheme], texts, params)
                row.decode_tok_s.append(rate)
            if progress is not None:
                progress(f"round {repeat + 1}/{repeats}: " + ", ".join(
                    f"{r.dtype} {r.scheme} {r.decode_tok_s[-1]:.0f}" for r in results) + " tok/s")
        for row in results:
            llm = engines[row.dtype, row.scheme]
            row.matmul = " and ".join(sorted({m.last_path for m in llm.model.modules() if isinstance(m, QuantizedLinear)}))
            row.agreement, row.prefix_agreement = _agreement(tokens[row.dtype, row.scheme],
                                                             tokens[row.dtype, "full precision"])
        machine = f"{platform.machine()} CPU, {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"
        return ServingResult(results, machine, torch.get_num_threads(), prompts, prompt_tokens, output_tokens, repeats)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the result here (e.g. benchmarks/results/quant_serving_2cpu.json)")
    args = parser.parse_args()
    result = measure(args.prompts, args.prompt_tokens, args.output_tokens, args.repeats)
    print(result.table())
    if args.json:
        result.to_json(args.json)


if __name__ == "__main__":
    main()
