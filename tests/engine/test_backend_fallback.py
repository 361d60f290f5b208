"""Choosing the attention backend: a Triton backend that fails its probe falls back to PyTorch with one
warning, unless Triton was asked for by name. Failures are made on purpose, so no GPU is needed."""

import copy
import os
import warnings

import pytest
import torch

from course_lib.engine import backend, triton_attention
from course_lib.engine.backend import AttentionBackendFallback
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

pytest.importorskip("triton")
needs_kernels = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                   reason="needs a GPU or Triton's interpreter")
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 28)), [30, 31]]
DRIVER_ERROR = "PTX .version 8.7 does not support .target sm_120"


@pytest.fixture
def model(tiny_model):
    return copy.deepcopy(tiny_model).float().to("cuda" if torch.cuda.is_available() else "cpu")


def make_llm(model, **kwargs) -> LLM:
    return LLM(model, max_model_len=64, num_gpu_blocks=32, block_size=4, max_num_batched_tokens=8,
               dtype=torch.float32, device=str(next(model.parameters()).device), **kwargs)


def greedy(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    return [output.outputs[0].token_ids for output in outputs]


@pytest.fixture
def triton_by_default(monkeypatch):
    """The default choice as on a CUDA machine, whatever this machine has."""
    monkeypatch.setattr(backend, "default_attention_backend", lambda device: "triton")


@pytest.fixture
def broken_compiler(monkeypatch):
    """The decode kernel fails as a Triton that cannot target the GPU would."""
    def fail(*args, **kwargs):
        raise RuntimeError(DRIVER_ERROR)

    monkeypatch.setattr(triton_attention, "paged_decode_attention", fail)


def test_the_default_on_a_cpu_never_probes_triton(monkeypatch, tiny_model):
    monkeypatch.setattr(backend, "probe_triton", lambda *args: pytest.fail("the CPU default must not probe Triton"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = LLM(tiny_model.to("cpu"), max_model_len=64, num_gpu_blocks=32, device="cpu", dtype=torch.float32)
    assert llm.attention_backend in ("cpu", "torch")  # tests/engine/test_cpu_attention.py: which, and when


@needs_kernels
def test_a_working_triton_backend_passes_its_probe(model, triton_by_default):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = make_llm(model)
    assert llm.attention_backend == "triton"


@needs_kernels  # the probe's cache write runs for real before the broken kernel
def test_a_failing_compile_falls_back_to_torch_with_one_warning(model, triton_by_default, broken_compiler):
    with pytest.warns(AttentionBackendFallback) as caught:
        llm = make_llm(model)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"RuntimeError: {DRIVER_ERROR}" in message and "PyTorch attention backend instead" in message
    assert 'attention_backend="torch"' in message and 'attention_backend="triton"' in message
    assert caught[0].filename == __file__  # points at the caller's LLM(...) line
    assert llm.attention_backend == "torch"
    assert greedy(llm) == greedy(make_llm(model, attention_backend="torch"))


@needs_kernels
@pytest.mark.parametrize("wrong", [torch.zeros_like, lambda out: torch.full_like(out, float("nan"))],
                         ids=["zeros", "nan"])
def test_kernels_that_run_but_give_wrong_outputs_also_fall_back(monkeypatch, model, triton_by_default, wrong):
    real = triton_attention.paged_prefill_attention
    monkeypatch.setattr(triton_attention, "paged_prefill_attention",
                        lambda *args, **kwargs: wrong(real(*args, **kwargs)))
    with pytest.warns(AttentionBackendFallback, match="attention step differs from PyTorch's"):
        llm = make_llm(model)
    assert llm.attention_backend == "torch"


@needs_kernels
def test_a_wrong_split_kv_decode_falls_back_too(monkeypatch, model, triton_by_default):
    """The probe forces two partitions, so a broken reduction is caught before generate reaches long contexts."""
    from course_lib.kernels import paged_attention

    real = paged_attention.paged_decode_attention

    def broken(*args, num_partitions=None, **kwargs):
        out = real(*args, num_partitions=num_partitions, **kwargs)
        return out * 2 if num_partitions and num_partitions > 1 else out

    monkeypatch.setattr(paged_attention, "paged_decode_attention", broken)
    with pytest.warns(AttentionBackendFallback, match="split-KV decode differs from PyTorch's"):
        llm = make_llm(model)
    assert llm.attention_backend == "torch"


@needs_kernels
def test_an_explicit_triton_is_never_replaced(model, broken_compiler):
    with pytest.raises(RuntimeError, match="failed its start-up probe") as error:
        make_llm(model, attention_backend="triton")
    assert DRIVER_ERROR in str(error.value) and 'Use attention_backend="torch"' in str(error.value)


def test_triton_on_a_cpu_without_the_interpreter_says_how_to_run_it(monkeypatch, tiny_model):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs TRITON_INTERPRET=1"):
        LLM(tiny_model.to("cpu"), max_model_len=64, num_gpu_blocks=32, device="cpu", attention_backend="triton")
