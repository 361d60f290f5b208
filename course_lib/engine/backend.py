"""Which attention backend an ``LLM`` runs, and the probes that show a compiled one works here.

``attention_backend=None`` (the default) means Triton on CUDA, the C++ decode kernel on a CPU
(``"cpu"``, for float32 and float64 KV caches: ``engine/cpu_attention.py``), and PyTorch elsewhere.
Before the engine runs a compiled backend, a probe pushes one tiny step (two decodes, and a
three-token chunk after cached context) through both it and the PyTorch backend's ``write`` and
``attend`` at the model's heads, KV heads, head dim, block size, dtype and device, and compares the
outputs. For Triton it then checks split-KV decode (forced to two partitions) against its
reference, and with an fp8 KV cache runs on an fp8 cache with scales. That compiles the kernels the
engine will launch, so an old GPU, a driver mismatch, a Triton that cannot target the device or a
missing C++ compiler fails here, not in the middle of ``generate``.

* Default, and the Triton probe fails: one ``AttentionBackendFallback`` warning that names the
  error and the flags; the engine runs on ``"torch"``.
* Default on a CPU: ``"torch"`` without a word when the C++ kernel does not apply (another
  dtype, such as bfloat16) or cannot be built (no compiler: ``./course check`` says why); the
  warning only when it builds but gives different outputs.
* ``attention_backend="triton"`` or ``"cpu"``, and it cannot run: an error. An explicit choice is
  never overridden silently.
* ``attention_backend="torch"``: no probe.

A kernel that faults while running (an illegal memory access) can leave the CUDA context unusable
for the fallback too; compile errors and missing kernel images, the failures this is for, do not.
"""

from __future__ import annotations

import warnings

import torch

from course_lib.engine.attention import build_metadata
from course_lib.models.llama import LlamaForCausalLM

CPU_KERNEL_DTYPES = (torch.float32, torch.float64)


def _hint(name: str) -> str:
    return (f'Pass attention_backend="torch" to LLM to use PyTorch attention without this check, or '
            f'attention_backend="{name}" to make a failure an error.')


class AttentionBackendFallback(RuntimeWarning):
    """A compiled attention backend failed its probe; the engine runs on the PyTorch backend."""


def default_attention_backend(device: torch.device) -> str:
    """Triton on CUDA, the C++ decode kernel on a CPU, PyTorch elsewhere."""
    return {"cuda": "triton", "cpu": "cpu"}.get(device.type, "torch")


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def resolve_attention_backend(requested: str | None, model: LlamaForCausalLM, block_size: int,
                              kv_cache_dtype: torch.dtype | None = None) -> str:
    """The backend the engine runs for ``model``'s device and dtype (and its cache's, default the
    model's), by the module docstring's rules. Names other than "triton" pass through
    (``ModelRunner`` refuses unknown ones)."""
    param = next(model.parameters())
    choice = requested or default_attention_backend(param.device)
    if choice == "cpu":
        return _resolve_cpu(requested, model, block_size, kv_cache_dtype or param.dtype)
    if choice != "triton":
        return choice
    check_triton_possible(param.device)
    attn = model.model.layers[0].self_attn  # the heads this model (or tensor-parallel shard) runs
    try:
        probe_triton(attn.num_heads, attn.num_kv_heads, attn.head_dim, block_size, param.dtype, param.device,
                     kv_cache_dtype)
    except Exception as error:  # noqa: BLE001 - whatever compiling or launching raises is the reason
        if requested == "triton":
            raise RuntimeError(f'attention_backend="triton" failed its start-up probe on {param.device}: '
                               f'{_one_line(error)}. Use attention_backend="torch", or install a Triton that '
                               "supports this GPU (./course check tests it).") from error
        warnings.warn(f"The Triton attention kernels failed on {param.device} ({_one_line(error)}); this LLM "
                      f"uses the PyTorch attention backend instead. {_hint('triton')}", AttentionBackendFallback,
                      stacklevel=3)
        return "torch"
    return "triton"


def _resolve_cpu(requested: str | None, model: LlamaForCausalLM, block_size: int, kv_cache_dtype: torch.dtype) -> str:
    """"cpu" where the C++ kernel applies, builds and passes its probe; else "torch" (by default) or
    an error (when asked for by name)."""
    from course_lib.kernels.cpu_paged_attention import kernel_problem

    param = next(model.parameters())
    if param.device.type != "cpu":
        problem = f"the model is on {param.device}, not the CPU"
    elif param.dtype not in CPU_KERNEL_DTYPES or kv_cache_dtype != param.dtype:
        problem = f"the kernel reads float32 or float64 only (model {param.dtype}, KV cache {kv_cache_dtype})"
    else:
        problem = kernel_problem()
    if problem is None:
        attn = model.model.layers[0].self_attn
        try:
            probe_cpu(attn.num_heads, attn.num_kv_heads, attn.head_dim, block_size, param.dtype)
        except Exception as error:  # noqa: BLE001 - a kernel that builds but misbehaves
            problem = _one_line(error)
            if requested is None:
                warnings.warn(f"The CPU attention kernel failed its probe ({problem}); this LLM uses the PyTorch "
                              f"attention backend instead. {_hint('cpu')}", AttentionBackendFallback, stacklevel=4)
    if problem is None:
        return "cpu"
    if requested == "cpu":
        raise ValueError(f'attention_backend="cpu" cannot run here: {problem}. Use attention_backend="torch".')
    return "torch"


def check_triton_possible(device: torch.device) -> None:
    """Raise ``ValueError`` saying what to do when Triton cannot run on ``device`` at all."""
    if device.type == "cpu" and not triton_interprets():
        raise ValueError('attention_backend="triton" on the CPU needs TRITON_INTERPRET=1 in the environment '
                         "before Python starts (kernels then run in Triton's slow interpreter); "
                         'or use attention_backend="torch".')


def triton_interprets() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET`` set to 1, true, on or yes)."""
    try:
        import triton
    except ImportError:
        return False
    return bool(triton.knobs.runtime.interpret)


def _probe_step(build, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                device: torch.device, kv_cache_dtype: torch.dtype | None = None):
    """One tiny step (two decodes, and a three-token chunk after cached context) through the PyTorch
    backend and the backend whose metadata ``build`` makes: (PyTorch's output, the other's), the
    cache after the other's write, the block tables, the context lengths, the queries and the fp8
    scales (None unless ``kv_cache_dtype`` is fp8)."""
    query_lens, seq_lens = [1, 1, 3], [block_size + 1, 2, block_size + 3]  # two cross a block boundary
    tables, used = [], 0
    for length in seq_lens:
        count = -(-length // block_size)
        tables.append(list(range(used, used + count)))
        used += count
    slots = [table[p // block_size] * block_size + p % block_size
             for table, n, length in zip(tables, query_lens, seq_lens) for p in range(length - n, length)]
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    cache = random(2, used, block_size, num_kv_heads, head_dim)
    fp8 = kv_cache_dtype == torch.float8_e4m3fn
    kv_scales = (0.02, 0.01) if fp8 else None  # values up to ~4 land at ~200 and ~400 of e4m3's 448
    if fp8:
        cache = cache.to(kv_cache_dtype)
    q, k, v = (random(len(slots), heads, head_dim) for heads in (num_heads, num_kv_heads, num_kv_heads))
    outputs = []
    for make in (build_metadata, build):
        metadata = make(slots, query_lens, seq_lens, tables, block_size, device)
        kv_cache = cache.clone()
        metadata.write(kv_cache, k, v, kv_scales)
        outputs.append(metadata.attend(q, kv_cache, head_dim ** -0.5, kv_scales).float())
    return outputs, kv_cache, tables, seq_lens, q, kv_scales


def _check_close(name: str, backend: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tolerance = 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2
    difference = (got - want).abs().max().item()
    if not difference <= tolerance:  # a NaN counts as a difference
        raise ValueError(f"the {backend} backend's {name} differs from PyTorch's by up to {difference:.3g} "
                         f"(tolerance {tolerance:g}) on a {dtype} probe")


def probe_cpu(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> None:
    """The probe step on the CPU backend against the PyTorch backend. Raises what building the
    kernel raises, or ``ValueError`` when the outputs differ."""
    from course_lib.engine.cpu_attention import CpuAttentionMetadata

    (want, got), *_ = _probe_step(CpuAttentionMetadata.build, num_heads, num_kv_heads, head_dim, block_size,
                                  dtype, torch.device("cpu"))
    _check_close("attention step", "CPU", got, want, dtype)


def probe_triton(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, kv_cache_dtype: torch.dtype | None = None) -> None:
    """The probe step on the Triton backend against the PyTorch backend (on a ``kv_cache_dtype``
    cache, default ``dtype``), then split-KV decode against its reference. Raises what compiling or
    launching raises, or ``ValueError`` when the outputs differ."""
    from course_lib.engine.triton_attention import TritonAttentionMetadata

    (want, got), kv_cache, tables, seq_lens, q, kv_scales = _probe_step(
        TritonAttentionMetadata.build, num_heads, num_kv_heads, head_dim, block_size, dtype, device, kv_cache_dtype)
    _check_close("attention step", "Triton", got, want, dtype)
    # split-KV decode (long contexts on few sequences) and its reduction kernel, forced on the first sequence
    from course_lib.kernels.paged_attention import paged_decode_attention, paged_decode_attention_ref

    one = (q[:1], kv_cache[0], kv_cache[1], torch.tensor(tables[:1], dtype=torch.int32, device=device),
           torch.tensor(seq_lens[:1], device=device), head_dim ** -0.5)
    scales = dict(zip(("k_scale", "v_scale"), kv_scales or (1.0, 1.0)))
    _check_close("split-KV decode", "Triton", paged_decode_attention(*one, num_partitions=2, **scales).float(),
                 paged_decode_attention_ref(*one, **scales).float(), dtype)
