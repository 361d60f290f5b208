"""Which attention backend an ``LLM`` runs, and the probe that shows the Triton one works here.

``attention_backend=None`` (the default) means Triton on CUDA and PyTorch elsewhere (on a CPU the
kernels only run in Triton's slow interpreter). Before the engine runs the Triton backend,
``probe_triton`` pushes one tiny step (a decode, and a three-token chunk after cached context)
through both backends' ``write`` and ``attend`` at the model's heads, KV heads, head dim, block
size, dtype and device, and compares the outputs; then split-KV decode (forced to two partitions)
against its reference; with an fp8 KV cache, on an fp8 cache with scales. That compiles the kernels the
engine will launch, so an old GPU, a driver mismatch or a Triton that cannot target the device fails here,
not in the middle of ``generate``.

* Default, and the probe fails: one ``AttentionBackendFallback`` warning that names the error and
  the flags; the engine runs on ``"torch"``.
* ``attention_backend="triton"``, and the probe fails: ``RuntimeError``. An explicit choice is
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

HINT = ('Pass attention_backend="torch" to LLM to use PyTorch attention without this check, or '
        'attention_backend="triton" to make a failure an error.')


class AttentionBackendFallback(RuntimeWarning):
    """The Triton attention backend failed its probe; the engine runs on the PyTorch backend."""


def default_attention_backend(device: torch.device) -> str:
    """Triton where its kernels compile (CUDA), PyTorch elsewhere."""
    return "triton" if device.type == "cuda" else "torch"


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
                      f"uses the PyTorch attention backend instead. {HINT}", AttentionBackendFallback, stacklevel=3)
        return "torch"
    return "triton"


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


def probe_triton(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, kv_cache_dtype: torch.dtype | None = None) -> None:
    """One tiny step on the Triton backend against the PyTorch backend (on a ``kv_cache_dtype`` cache,
    default ``dtype``). Raises what compiling or launching raises, or ``ValueError`` when the outputs
    differ (a NaN counts as a difference)."""
    from course_lib.engine.triton_attention import TritonAttentionMetadata

    query_lens, seq_lens = [1, 3], [block_size + 1, block_size + 3]  # both cross a block boundary
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
    for build in (build_metadata, TritonAttentionMetadata.build):
        metadata = build(slots, query_lens, seq_lens, tables, block_size, device)
        kv_cache = cache.clone()
        metadata.write(kv_cache, k, v, kv_scales)
        outputs.append(metadata.attend(q, kv_cache, head_dim ** -0.5, kv_scales).float())
    # split-KV decode (long contexts on few sequences) and its reduction kernel, forced on the first sequence
    from course_lib.kernels.paged_attention import paged_decode_attention, paged_decode_attention_ref

    one = (q[:1], kv_cache[0], kv_cache[1], torch.tensor(tables[:1], dtype=torch.int32, device=device),
           torch.tensor(seq_lens[:1], device=device), head_dim ** -0.5)
    scales = dict(zip(("k_scale", "v_scale"), kv_scales or (1.0, 1.0)))
    outputs += [paged_decode_attention(*one, num_partitions=2, **scales).float(),
                paged_decode_attention_ref(*one, **scales).float()]
    tolerance = 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2
    for name, (got, want) in (("attention step", outputs[1::-1]), ("split-KV decode", outputs[2:])):
        difference = (got - want).abs().max().item()
        if not difference <= tolerance:
            raise ValueError(f"the Triton backend's {name} differs from PyTorch's by up to {difference:.3g} "
                             f"(tolerance {tolerance:g}) on a {dtype} probe")
