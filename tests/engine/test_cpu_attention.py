"""The CPU attention backend: the C++ paged-decode kernel against a plain gather-then-softmax
reference (the compiled head shapes and the run-time-sized code), its refusals, the engine's
choice of backend, and greedy outputs through the engine equal to the PyTorch backend's."""

import copy
import os
import random
import warnings

import pytest
import torch

from course_lib.engine import backend, cpu_attention
from course_lib.engine.backend import AttentionBackendFallback
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.kernels import cpu_paged_attention
from course_lib.kernels.cpu_paged_attention import kernel_problem, paged_decode_attention_cpu

PROBLEM = kernel_problem()
if PROBLEM and os.environ.get("CI") == "true":  # CI's machine has a compiler: the kernel must build there
    raise RuntimeError(f"the CPU paged-attention kernel does not build: {PROBLEM}")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"the CPU kernel does not build here: {PROBLEM}")


def reference(q, k_cache, v_cache, tables, lens, scale):
    """Each sequence's context gathered position by position, then softmax(q k^T) v per head."""
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for b, length in enumerate(lens.tolist()):
        pos = torch.arange(length)
        blocks = tables[b, pos // block_size]
        k = k_cache[blocks, pos % block_size].repeat_interleave(group, dim=1)  # [L, heads, D]
        v = v_cache[blocks, pos % block_size].repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b] * scale, k), dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", weights, v)
    return out


def random_case(seed, head_dim, kv_heads, group, block_size, dtype, batch=5, num_blocks=40):
    """Scattered block tables (a random permutation, padded rows), lengths from 1 to a few blocks,
    block boundaries included."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache = (torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, dtype=dtype)
                        for _ in range(2))
    lens = [rng.choice([1, block_size, block_size + 1, rng.randint(1, 4 * block_size)]) for _ in range(batch)]
    width = max(-(-n // block_size) for n in lens) + 1
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lens):
        needed = -(-n // block_size)
        tables[b, :needed] = torch.tensor([order.pop() for _ in range(needed)])
    q = torch.randn(batch, kv_heads * group, head_dim, generator=gen, dtype=dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens), head_dim ** -0.5


SHAPES = [(32, 2, 3), (32, 1, 3), (32, 1, 2),  # compiled as constants (the shipped models)
          (16, 2, 2), (64, 1, 1), (8, 4, 1), (24, 3, 2)]  # run-time sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}-kv{}-g{}".format(*s))
def test_the_kernel_matches_the_gather_reference(shape, block_size, dtype):
    for seed in range(3):
        case = random_case(seed, *shape, block_size, dtype)
        got, want = paged_decode_attention_cpu(*case), reference(*case)
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12
        assert torch.allclose(got, want, atol=tolerance, rtol=tolerance), (seed, (got - want).abs().max())


def test_a_query_laid_out_in_another_order_is_accepted():
    q, *rest = random_case(5, 32, 2, 3, 4, torch.float32)
    permuted = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, heads outermost in memory
    assert not permuted.is_contiguous()
    assert torch.equal(paged_decode_attention_cpu(permuted, *rest), paged_decode_attention_cpu(q, *rest))


def test_it_writes_only_the_rows_it_is_given_and_ignores_table_padding():
    q, k_cache, v_cache, tables, lens, scale = random_case(7, 32, 2, 3, 4, torch.float32)
    out = torch.full((len(q) + 2, *q.shape[1:]), 5.0)
    paged_decode_attention_cpu(q, k_cache, v_cache, tables, lens, scale, out=out[1:-1])
    assert (out[0] == 5).all() and (out[-1] == 5).all()
    padded = tables.clone()
    for b, n in enumerate(lens.tolist()):  # entries past a sequence's blocks are never read
        padded[b, -(-n // 4):] = 10_000
    assert torch.equal(paged_decode_attention_cpu(q, k_cache, v_cache, padded, lens, scale), out[1:-1])


@pytest.mark.parametrize("change, message", [
    (lambda c: (c[0], c[1], c[2], c[3], torch.tensor([0, *c[4][1:].tolist()]), c[5]), "is not covered"),
    (lambda c: (c[0], c[1], c[2], c[3], c[4] + 100, c[5]), "is not covered"),
    (lambda c: (c[0], c[1], c[2], c[3].clone().fill_(40), c[4], c[5]), "outside the cache's 40 blocks"),
    (lambda c: (c[0].half(), c[1].half(), c[2].half(), c[3], c[4], c[5]), "float32 or float64 only"),
    (lambda c: (c[0], c[1], c[2].double(), c[3], c[4], c[5]), "of one dtype"),
    (lambda c: (c[0], c[1][:, :, :0], c[2][:, :, :0], c[3], c[4], c[5]), "must be positive"),
], ids=["empty-context", "length-past-table", "block-out-of-range", "half", "mixed-dtypes", "no-kv-heads"])
def test_bad_inputs_are_refused_not_read_out_of_bounds(change, message):
    case = change(random_case(3, 32, 2, 3, 4, torch.float32))
    with pytest.raises(RuntimeError, match=message):
        paged_decode_attention_cpu(*case)


def test_decodes_between_other_requests_are_attended_through_their_rows():
    """Rows of decoding requests that are not one run (``prepare`` always puts them first; the
    backend does not rely on it): the same outputs as the PyTorch backend's, row for row."""
    from course_lib.engine.attention import build_metadata
    from course_lib.engine.cpu_attention import CpuAttentionMetadata

    block_size, query_lens, seq_lens = 4, [3, 1, 2, 1], [9, 6, 5, 13]
    tables = [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9, 10]]
    slots = [tables[r][p // block_size] * block_size + p % block_size
             for r, (n, length) in enumerate(zip(query_lens, seq_lens)) for p in range(length - n, length)]
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 11, block_size, 2, 32, generator=gen)
    q = torch.randn(len(slots), 6, 32, generator=gen)
    k, v = torch.randn(2, len(slots), 2, 32, generator=gen)
    outputs = []
    for build in (build_metadata, CpuAttentionMetadata.build):
        metadata, kv_cache = build(slots, query_lens, seq_lens, tables, block_size, "cpu"), cache.clone()
        metadata.write(kv_cache, k, v)
        outputs.append(metadata.attend(q, kv_cache, 32 ** -0.5))
    assert isinstance(metadata.decode_rows, torch.Tensor) and metadata.decode_rows.tolist() == [3, 6]
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)


def make_llm(model, **kwargs):
    return LLM(model, max_model_len=128, num_gpu_blocks=40, block_size=4, max_num_batched_tokens=16,
               max_num_seqs=4, device="cpu", **kwargs)


def test_the_cpu_default_is_the_kernel_for_float32_and_float64_and_torch_otherwise(tiny_model):
    def copy_in(dtype):
        return copy.deepcopy(tiny_model).to(dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_llm(tiny_model, dtype=torch.float64).attention_backend == "cpu"
        assert make_llm(copy_in(torch.float32), dtype=torch.float32).attention_backend == "cpu"
        assert make_llm(copy_in(torch.bfloat16), dtype=torch.bfloat16).attention_backend == "torch"
        assert make_llm(tiny_model, dtype=torch.float64, kv_cache_dtype="fp8").attention_backend == "torch"
    with pytest.raises(ValueError, match='attention_backend="cpu" cannot run here: the kernel reads float32 or '
                                         r'float64 only \(model torch.bfloat16'):
        make_llm(copy_in(torch.bfloat16), dtype=torch.bfloat16, attention_backend="cpu")


def test_no_compiler_means_torch_quietly_by_default_and_an_error_by_name(monkeypatch, tiny_model):
    monkeypatch.setattr(cpu_paged_attention, "kernel_problem", lambda retry=False: "RuntimeError: no C++ compiler")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_llm(tiny_model, dtype=torch.float64).attention_backend == "torch"
    with pytest.raises(ValueError, match=r"cannot run here: RuntimeError: no C\+\+ compiler"):
        make_llm(tiny_model, dtype=torch.float64, attention_backend="cpu")


def test_a_kernel_that_builds_but_is_wrong_falls_back_with_one_warning(monkeypatch, tiny_model):
    monkeypatch.setattr(cpu_attention, "paged_decode_attention_cpu",
                        lambda q, *args, out=None: (out if out is not None else torch.empty_like(q)).zero_())
    with pytest.warns(AttentionBackendFallback, match="CPU attention kernel failed its probe") as caught:
        llm = make_llm(tiny_model, dtype=torch.float64)
    assert len(caught) == 1 and caught[0].filename == __file__ and llm.attention_backend == "torch"
    assert 'attention_backend="cpu" to make a failure an error' in str(caught[0].message)
    with pytest.raises(ValueError, match="attention step differs from PyTorch's"):
        make_llm(tiny_model, dtype=torch.float64, attention_backend="cpu")


def test_the_probe_is_never_run_for_an_explicit_torch(monkeypatch, tiny_model):
    monkeypatch.setattr(backend, "probe_cpu", lambda *args: pytest.fail("no probe for attention_backend='torch'"))
    assert make_llm(tiny_model, dtype=torch.float64, attention_backend="torch").attention_backend == "torch"


@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}])
def test_the_shipped_model_generates_the_same_tokens_and_logprobs_on_both_backends(speculative):
    """float32, the benchmark's dtype: decodes through the kernel, chunked prefills and speculative
    verifications through SDPA, small pools (preemption), several sequences at once."""
    prompts = ["The engine pages", "def fibonacci(n):\n    ", "Attention reads every cached", "KV " * 12]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    results = {}
    for name in ("cpu", "torch"):
        llm = LLM("tiny-llama", dtype=torch.float32, attention_backend=name, num_gpu_blocks=24, block_size=4,
                  max_num_batched_tokens=24, max_num_seqs=3, max_model_len=96, speculative_config=speculative)
        assert llm.attention_backend == name
        results[name] = llm.generate(prompts, params)
        preemptions = {m.name: m.value for m in llm.get_metrics()}["vllm:num_preemptions"]
        assert preemptions > 0 or speculative  # the small pool really preempts
    for cpu, torch_ in zip(results["cpu"], results["torch"]):
        a, b = cpu.outputs[0], torch_.outputs[0]
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys()
            assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)
