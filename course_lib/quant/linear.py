"""Quantized drop-in replacements for ``nn.Linear``, and ``quantize_model_`` to swap them into a Llama.

A :class:`QuantizedLinear` is called exactly like the ``nn.Linear`` it replaces (``y = layer(x)``,
``x [..., in_features] -> y [..., out_features]`` in x's dtype), so ``LlamaForCausalLM.forward`` and
``forward_dense`` run unchanged. The schemes:

* ``"int8"``: weight-only int8, one scale per output channel. Two paths, by the layer's ``kernel``
  ("auto" or "torch"): ``"torch._weight_int8pack_mm"``, PyTorch's CPU kernel multiplying the int8
  codes by bfloat16 activations (taken by "auto" where :func:`course_lib.quant.int8.int8pack_fits`:
  CPU, bfloat16, K a multiple of 16), and ``"dequantize + F.linear"`` everywhere else (float32 on
  the CPU, where that kernel's loop is scalar and slower; CUDA): memory saved at rest, no compute.
* ``"int4"``: weight-only int4, group-wise along in_features (``group_size``, ``symmetric``). Two
  matmul paths, chosen per call by the layer's ``kernel`` ("auto", "triton" or "torch"):
  ``"triton w4a16"``, the fused kernel of ``course_lib/kernels/w4a16.py``, which reads the packed
  codes and dequantizes in registers (it reads ``Int4Weight``'s layout as ``quantize_int4`` writes
  it; inputs zero-padded to the padded K of ``pad_k``); and ``"dequantize + F.linear"``, PyTorch's
  dequantize-then-matmul, the reference the kernel must match. "auto" (the default) takes the kernel
  for CUDA inputs in float16, bfloat16 or float32 when Triton imports, and PyTorch otherwise (a CPU
  would run the kernel only in Triton's slow interpreter); "triton" forces the kernel (on a CPU it
  needs ``TRITON_INTERPRET=1``), "torch" the PyTorch path. ``set_int4_kernel_(model, kernel)`` sets
  every layer's. The CUDA path is the tested kernel (``tests/kernels/test_w4a16.py``) called on the
  layer's own buffers; on a CPU the two paths are checked equal under the interpreter.
* ``"w8a8"``: int8 weights and int8 activations quantized per token at run time; integer matmul
  with int32 accumulation (:func:`course_lib.quant.int8.w8a8_matmul`: ``torch._int_mm`` on the CPU
  and, rows and K/N zero-padded to its shape rules, on CUDA).

The quantized tensors are registered as buffers, so ``.to(device)`` and ``state_dict()`` carry them.
Scales are float32 by contract; they are read back as float32 even if a later ``.to(dtype)`` cast them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.quant.int4 import Int4Weight, check_group_size, dequantize_int4, quantize_int4
from course_lib.quant.int8 import (
    EMULATED,
    INT8PACK,
    INT_MM,
    Int8Weight,
    dequantize_int8,
    int8pack_fits,
    int8pack_matmul,
    int_mm_runs_on,
    quantize_int8,
    w8a8_matmul,
)

SCHEMES = ("int8", "int4", "w8a8")
KERNELS = {"int4": ("auto", "triton", "torch"), "int8": ("auto", "torch"), "w8a8": ("auto",)}  # per scheme
INT4_TRITON, TORCH_PATH = "triton w4a16", "dequantize + F.linear"
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the W4A16 kernel takes
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def padded_in_features(in_features: int, group_size: int) -> int:
    """in_features rounded up to a multiple of group_size (what ``pad_k=True`` stores)."""
    return -(-in_features // group_size) * group_size


class QuantizedLinear(nn.Module):
    """``nn.Linear`` with its weight stored quantized.

    Invariants: ``in_features``/``out_features`` are the original layer's; the bias (if any) stays in
    the original precision; ``forward(x)`` returns ``x.dtype``; ``last_path`` is the matmul path of the
    latest call ("dequantize + F.linear", "triton w4a16", "torch._weight_int8pack_mm", "torch._int_mm" or
    "emulated int32").

    int4 with ``pad_k=True``: when in_features is not a multiple of group_size the weight is padded
    with zero columns up to the next multiple before quantizing, and the dequantized weight is cut
    back to in_features. Zero columns change no group's max|w| or (0-including) range, so this is
    exactly a shorter last group; the stored ``Int4Weight.shape`` is then ``(N, padded K)``.
    """

    def __init__(self, linear: nn.Linear, scheme: str, group_size: int = 128, symmetric: bool = True,
                 pad_k: bool = False, kernel: str = "auto") -> None:
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        self.kernel = check_kernel(kernel, scheme)  # int4's and int8's matmul path (KERNELS)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"QuantizedLinear wraps an nn.Linear, got {type(linear).__name__}")
        self.scheme = scheme
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group_size, self.symmetric = group_size, symmetric
        self.last_path: str | None = None
        weight = linear.weight.detach()
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        if scheme == "int4":
            k = self.in_features
            if k % group_size and pad_k and group_size in (32, 64, 128):
                weight = F.pad(weight, (0, padded_in_features(k, group_size) - k))
            q = quantize_int4(weight, group_size=group_size, symmetric=symmetric)
            self.register_buffer("packed", q.packed)
            self.register_buffer("scales", q.scales)
            self.register_buffer("zeros", q.zeros)
            self._int4_shape = q.shape
        else:
            q = quantize_int8(weight)
            self.register_buffer("qweight", q.q)
            self.register_buffer("scales", q.scales)

    @property
    def quantized(self) -> Int4Weight | Int8Weight:
        """The stored weight as its dataclass (views of this module's buffers)."""
        if self.scheme == "int4":
            return Int4Weight(self.packed, self.scales.float(), self.zeros, self.group_size, self.symmetric,
                              self._int4_shape)
        return Int8Weight(self.qweight, self.scales.float())

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized weight (codes + scales + zeros) plus the bias, if any."""
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return self.quantized.nbytes + bias

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``[out_features, in_features]`` weight this layer effectively multiplies by."""
        if self.scheme == "int4":
            return dequantize_int4(self.quantized, dtype)[:, : self.in_features]
        return dequantize_int8(self.quantized, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.scheme == "w8a8":
            y, self.last_path = w8a8_matmul(x, self.quantized)
            return y if bias is None else y + bias
        if self.scheme == "int4" and int4_path(self.kernel, x) == INT4_TRITON:
            self.last_path = INT4_TRITON
            y = self._w4a16(x)
            return y if bias is None else y + bias
        if self.scheme == "int8" and self.kernel == "auto" and int8pack_fits(x, self.in_features):
            self.last_path = INT8PACK
            y = int8pack_matmul(x, self.quantized)
            return y if bias is None else y + bias
        self.last_path = TORCH_PATH
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def _w4a16(self, x: torch.Tensor) -> torch.Tensor:
        """The Triton kernel on ``x [..., in_features]``: batch dims flattened into M, K zero-padded
        to the stored (padded) K, whose extra weight columns are zero codes' columns anyway."""
        from course_lib.kernels.w4a16 import w4a16_matmul

        rows = x.reshape(-1, self.in_features)
        padded = self._int4_shape[1]
        if padded != self.in_features:
            rows = F.pad(rows, (0, padded - self.in_features))
        return w4a16_matmul(rows, self.quantized).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        extra = f", group_size={self.group_size}, symmetric={self.symmetric}" if self.scheme == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme!r}{extra}, "
                f"bias={self.bias is not None}")


def check_kernel(kernel: str, scheme: str = "int4") -> str:
    """``kernel`` if ``scheme`` has such a matmul path (``KERNELS``), else ValueError."""
    if kernel not in KERNELS[scheme]:
        raise ValueError(f"kernel must be one of {KERNELS[scheme]} for {scheme} (its matmul path), got {kernel!r}")
    return kernel


def _triton_state() -> tuple[bool, bool]:
    """(Triton imports, Triton interprets kernels on the CPU)."""
    try:
        import triton
    except ImportError:
        return False, False
    return True, bool(triton.knobs.runtime.interpret)


def int4_path(kernel: str, x: torch.Tensor) -> str:
    """The int4 matmul path a layer with ``kernel`` takes for input ``x`` (the module docstring's rule).
    Forcing "triton" where it cannot run raises ``ValueError`` saying what to change."""
    if kernel == "torch" or (kernel == "auto" and not (x.is_cuda and x.dtype in KERNEL_DTYPES)):
        return TORCH_PATH  # decided without touching Triton: this runs on every int4 layer's every call
    available, interprets = _triton_state()
    if kernel == "auto":
        return INT4_TRITON if available else TORCH_PATH
    if not available:
        raise ValueError('kernel="triton" needs the triton package (Linux); use kernel="torch" or "auto".')
    if not x.is_cuda and not interprets:
        raise ValueError('kernel="triton" on a CPU needs TRITON_INTERPRET=1 in the environment before Python '
                         'starts (the slow interpreter); use kernel="auto" or "torch".')
    if x.dtype not in KERNEL_DTYPES:
        raise ValueError(f'kernel="triton" takes float16, bfloat16 or float32 inputs, got {x.dtype}; cast the '
                         'model, or use kernel="auto" or "torch".')
    return INT4_TRITON


def set_kernel_(model: nn.Module, kernel: str, scheme: str = "int4") -> int:
    """Set ``kernel`` on every :class:`QuantizedLinear` of ``scheme`` in ``model``; returns how many.
    (``kernel="torch"`` on int8 layers brings back dequantize + F.linear, the reference.)"""
    check_kernel(kernel, scheme)
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.scheme == scheme]
    for layer in layers:
        layer.kernel = kernel
    return len(layers)


def set_int4_kernel_(model: nn.Module, kernel: str) -> int:
    """:func:`set_kernel_` for the int4 layers."""
    return set_kernel_(model, kernel, "int4")


def matmul_path(scheme: str, device: torch.device | str, dtype: torch.dtype, kernel: str = "auto",
                in_features: int = 0) -> str:
    """The matmul a layer of ``scheme`` with ``in_features`` runs for inputs of ``dtype`` on ``device``
    (what its ``last_path`` will say)."""
    x = torch.empty(0, in_features, device=device, dtype=dtype)
    if scheme == "int4":
        return int4_path(kernel, x)
    if scheme == "w8a8":
        return INT_MM if int_mm_runs_on(x.device) else EMULATED
    return INT8PACK if kernel == "auto" and int8pack_fits(x, in_features) else TORCH_PATH


def _targets(model: nn.Module, include_lm_head: bool) -> list[tuple[nn.Module, str, str]]:
    """(parent, attribute, qualified name) of every nn.Linear to replace."""
    found = []
    layers = model.model.layers if hasattr(model, "model") and hasattr(model.model, "layers") else None
    if layers is None:
        raise ValueError("quantize_model_ expects a LlamaForCausalLM-like model with .model.layers")
    for i, layer in enumerate(layers):
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear):
                parent_name, _, attr = name.rpartition(".")
                found.append((layer.get_submodule(parent_name) if parent_name else layer, attr,
                              f"model.layers.{i}.{name}"))
    if include_lm_head and isinstance(getattr(model, "lm_head", None), nn.Linear):
        found.append((model, "lm_head", "lm_head"))
    return found


def _tensor_bytes(module: nn.Module) -> int:
    tensors = list(module.parameters(recurse=False)) + [b for b in module.buffers(recurse=False) if b is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def quantize_model_(model: nn.Module, scheme: str, *, include_lm_head: bool = False, group_size: int = 128,
                    symmetric: bool = True, pad_k: bool = False, kernel: str = "auto") -> dict:
    """Replace, in place, every ``nn.Linear`` inside the decoder layers (q/k/v/o, gate/up/down) with a
    :class:`QuantizedLinear`; the LM head too if ``include_lm_head``.

    By default the LM head and the embeddings (and the norms) stay in full precision, as is common
    practice: they are a small share of a large model's weights and the logits are the most
    sensitive to error. ``group_size``, ``symmetric`` and ``pad_k`` apply to ``"int4"`` only, ``kernel`` to
    "int4" and "int8" (``KERNELS``).

    Every layer is checked before any is replaced, so a bad ``group_size`` leaves the model untouched.
    Returns a summary: ``scheme``, ``options``, ``layers_replaced`` (qualified names),
    ``num_layers_replaced``, ``kept_full_precision`` (Linear/Embedding modules left as they were),
    ``bytes_before`` / ``bytes_after`` of the replaced layers (full-precision weight + bias, against
    codes + scales + zeros + bias), ``compression`` (before / after), and ``model_bytes_before`` /
    ``model_bytes_after`` (every parameter and buffer of the model), and ``matmul``: the path the
    replaced layers take on the model's device and dtype (:func:`matmul_path` per layer; several
    joined by " and " if layers differ; each layer's ``last_path`` says what its latest call ran).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    check_kernel(kernel, scheme)
    targets = _targets(model, include_lm_head)
    if scheme == "int4":
        bad = []
        for parent, attr, name in targets:
            k = getattr(parent, attr).in_features
            try:
                check_group_size(k, group_size)
            except ValueError as error:
                if pad_k and group_size in (32, 64, 128):
                    continue
                bad.append((name, k, error))
        if bad:
            names = ", ".join(f"{name} (K={k})" for name, k, _ in bad)
            raise ValueError(f"int4 with group_size G={group_size} cannot quantize {names}: {bad[0][2]}; "
                             f"or pass pad_k=True to zero-pad K up to a multiple of {group_size}")
    model_before = sum(_tensor_bytes(m) for m in model.modules())
    before = after = 0
    replaced = []
    for parent, attr, name in targets:
        linear = getattr(parent, attr)
        before += _tensor_bytes(linear)
        quantized = QuantizedLinear(linear, scheme, group_size=group_size, symmetric=symmetric, pad_k=pad_k,
                                    kernel=kernel)
        setattr(parent, attr, quantized)
        after += quantized.nbytes
        replaced.append(name)
    kept = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    options = ({"group_size": group_size, "symmetric": symmetric, "pad_k": pad_k, "kernel": kernel}
               if scheme == "int4" else {"kernel": kernel} if scheme == "int8" else {})
    param = next(model.parameters())
    paths = {matmul_path(scheme, param.device, param.dtype, kernel, getattr(parent, attr).in_features)
             for parent, attr, _ in targets}
    return {
        "scheme": scheme,
        "options": {**options, "include_lm_head": include_lm_head},
        "layers_replaced": replaced,
        "num_layers_replaced": len(replaced),
        "kept_full_precision": kept,
        "bytes_before": before,
        "bytes_after": after,
        "compression": before / after if after else float("nan"),
        "model_bytes_before": model_before,
        "model_bytes_after": sum(_tensor_bytes(m) for m in model.modules()),
        "matmul": " and ".join(sorted(paths)),
    }
