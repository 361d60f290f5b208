"""Tensor-parallel layers built from Megatron's two conjugate operators, on real ranks.

  f = copy_to_tensor_parallel       forward: identity        backward: all-reduce the gradient
  g = reduce_from_tensor_parallel   forward: all-reduce      backward: identity

A column-parallel linear (rank r holds out/N rows of W) takes its input through f and leaves its
output sharded; a row-parallel linear (rank r holds in/N columns of W) takes that sharded input
and sends its partial sums through g. Column then row is an MLP block, or an attention block whose
Q, K, V are split by heads: one all-reduce forward (g) and one backward (f's) per block.

Every layer is built from the full (unsharded) ``torch.nn.Linear`` and this rank's index, so a
test can compare it with the layer it came from. A ``CommCount`` records each collective the
block makes, by name, in forward and in backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.collectives.primitives import all_gather_flat


@dataclass
class CommCount:
    """The collectives one rank made, in call order: ``forward`` during forward passes,
    ``backward`` during backward passes."""
    forward: list[str] = field(default_factory=list)
    backward: list[str] = field(default_factory=list)


def _all_reduce(tensor: torch.Tensor, group, calls: list[str]) -> torch.Tensor:
    """Sum ``tensor`` over the group in place, recording the call."""
    dist.all_reduce(tensor, group=group)
    calls.append("all_reduce")
    return tensor


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, comm):
        ctx.group, ctx.comm = group, comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.contiguous().clone(), ctx.group, ctx.comm.backward), None, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, comm):
        return _all_reduce(x.contiguous().clone(), group, comm.forward)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_tensor_parallel(x: torch.Tensor, group=None, comm: CommCount | None = None) -> torch.Tensor:
    """f: ``x`` unchanged; its gradient is summed over the group (every rank's branch used x)."""
    return _CopyToTensorParallel.apply(x, group, comm or CommCount())


def reduce_from_tensor_parallel(x: torch.Tensor, group=None, comm: CommCount | None = None) -> torch.Tensor:
    """g: the sum of every rank's ``x``; its gradient passes through unchanged."""
    return _ReduceFromTensorParallel.apply(x, group, comm or CommCount())


def _shard(size: int, rank: int, world_size: int, what: str) -> slice:
    """Rank ``rank``'s contiguous 1/N of ``range(size)``; a clear error when N does not divide it."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1} for a tensor-parallel size of {world_size}, got {rank}.")
    if size % world_size:
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        raise ValueError(f"{what} = {size} does not divide by the tensor-parallel size {world_size}: make {what} a "
                         f"multiple of {world_size} (e.g. {size + world_size - size % world_size}) or use a "
                         f"tensor-parallel size that divides {size} ({', '.join(map(str, divisors))}).")
    per_rank = size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


class ColumnParallelLinear(nn.Module):
    """Rows ``self.rows`` of the full weight (and bias): output features split across ranks, so
    the output stays sharded. The input goes through f unless ``copy_input=False`` (when the
    caller already applied f once for several layers sharing the input)."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int, group=None, comm: CommCount | None = None,
                 copy_input: bool = True) -> None:
        super().__init__()
        self.rows = _shard(full.out_features, rank, world_size, "out_features")
        self.weight = nn.Parameter(full.weight.detach()[self.rows].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[self.rows].clone())
        self.group, self.comm, self.copy_input = group, comm or CommCount(), copy_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_tensor_parallel(x, self.group, self.comm)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Columns ``self.columns`` of the full weight: input features split across ranks, so the
    input arrives sharded and the partial products are summed by g. The whole bias lives on
    every rank and is added once, after the sum."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int, group=None,
                 comm: CommCount | None = None) -> None:
        super().__init__()
        self.columns = _shard(full.in_features, rank, world_size, "in_features")
        self.weight = nn.Parameter(full.weight.detach()[:, self.columns].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())
        self.group, self.comm = group, comm or CommCount()

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        out = reduce_from_tensor_parallel(F.linear(x_shard, self.weight), self.group, self.comm)
        return out if self.bias is None else out + self.bias


class MLP(nn.Module):
    """(..., features) -> (..., features): down(activation(up(x))), up: features -> hidden."""

    def __init__(self, features: int, hidden: int, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(features, hidden), nn.Linear(hidden, features)
        self.activation = activation or nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, head_dim) each -> (batch, heads, seq, head_dim); position i sees 0..i."""
    seq = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v


def attend_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Projected (batch, seq, heads*head_dim) q, k, v -> causal attention output of that shape."""
    batch, seq, width = q.shape
    split = [t.view(batch, seq, heads, width // heads).transpose(1, 2) for t in (q, k, v)]
    return causal_attention(*split).transpose(1, 2).reshape(batch, seq, width)


class Attention(nn.Module):
    """(batch, seq, features) -> (batch, seq, features): multi-head causal self-attention; head h
    uses features h*head_dim .. (h+1)*head_dim of q, k and v, head_dim = features / heads."""

    def __init__(self, features: int, heads: int) -> None:
        super().__init__()
        if features % heads:
            raise ValueError(f"features = {features} does not divide by heads = {heads}: every head needs "
                             "the same head_dim.")
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(features, features) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(attend_heads(self.q(x), self.k(x), self.v(x), self.heads))


class TensorParallelMLP(nn.Module):
    """Rank ``rank``'s part of ``full``: ``up`` column-parallel, ``down`` row-parallel; the
    activation acts on whole hidden features, so nothing is communicated between the matmuls."""

    def __init__(self, full: MLP, rank: int, world_size: int, group=None) -> None:
        super().__init__()
        _shard(full.up.out_features, rank, world_size, "MLP hidden size")
        self.comm = CommCount()
        self.up = ColumnParallelLinear(full.up, rank, world_size, group, self.comm)
        self.down = RowParallelLinear(full.down, rank, world_size, group, self.comm)
        self.activation = full.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))


class TensorParallelAttention(nn.Module):
    """Rank ``rank``'s heads/N heads of ``full``: q, k, v column-parallel (their rows are whole
    heads), out row-parallel. One f on the input serves q, k and v, so backward makes one all-reduce."""

    def __init__(self, full: Attention, rank: int, world_size: int, group=None) -> None:
        super().__init__()
        _shard(full.heads, rank, world_size, "heads")
        self.local_heads, self.group = full.heads // world_size, group
        self.comm = CommCount()
        self.q, self.k, self.v = (ColumnParallelLinear(layer, rank, world_size, group, self.comm, copy_input=False)
                                  for layer in (full.q, full.k, full.v))
        self.out = RowParallelLinear(full.out, rank, world_size, group, self.comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tensor_parallel(x, self.group, self.comm)
        return self.out(attend_heads(self.q(x), self.k(x), self.v(x), self.local_heads))


def wrong_order_mlp(x: torch.Tensor, full: MLP, rank: int, world_size: int, group=None,
                    comm: CommCount | None = None, middle_all_reduce: bool = True) -> torch.Tensor:
    """``full(x)`` (forward only) with the splits swapped: ``up`` row-split, ``down`` column-split.

    The row-split matmul leaves partial sums of every hidden feature, and the activation cannot
    act on partial sums, so they are all-reduced first; the column-split ``down`` then gives this
    rank's output columns, all-gathered at the end: two collectives where the right order needs one.

    ``middle_all_reduce=False`` defers the sum past the activation instead: each rank applies it to
    its own partial sum, multiplies by the whole ``down`` weight and the results are all-reduced
    (one collective). That is exact for a linear activation and wrong for a nonlinear one."""
    comm = comm if comm is not None else CommCount()
    columns = _shard(full.up.in_features, rank, world_size, "features")
    partial = F.linear(x[..., columns], full.up.weight[:, columns])
    if not middle_all_reduce:
        bias = full.up.bias if rank == 0 else torch.zeros_like(full.up.bias)  # counted once in the sum
        out = F.linear(full.activation(partial + bias), full.down.weight)
        return _all_reduce(out, group, comm.forward) + full.down.bias
    hidden = full.activation(_all_reduce(partial, group, comm.forward) + full.up.bias)
    rows = _shard(full.down.out_features, rank, world_size, "features")
    mine = F.linear(hidden, full.down.weight[rows], full.down.bias[rows])
    gathered = torch.empty((world_size, *mine.shape), dtype=mine.dtype, device=mine.device)
    all_gather_flat(gathered, mine.unsqueeze(0).contiguous(), group=group)
    comm.forward.append("all_gather")
    return torch.cat(gathered.unbind(0), dim=-1)  # rank r's columns land at rows r*out/N of down


def _max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _forward_backward(module: nn.Module, x: torch.Tensor, cotangent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``module(x)`` and the gradient of <module(x), cotangent> with respect to ``x``."""
    x = x.detach().clone().requires_grad_()
    out = module(x)
    out.backward(cotangent)
    return out.detach(), x.grad


def _layer_gradient_differences(parallel: nn.Module, reference: nn.Module, names: tuple[str, ...]) -> dict[str, float]:
    """Each sharded layer's weight and bias gradient against the matching slice of the full one's."""
    out = {}
    for name in names:
        shard, full = getattr(parallel, name), getattr(reference, name)
        index = (shard.rows,) if isinstance(shard, ColumnParallelLinear) else (slice(None), shard.columns)
        out[f"{name}.weight"] = _max_difference(shard.weight.grad, full.weight.grad[index])
        bias_index = index[0] if isinstance(shard, ColumnParallelLinear) else slice(None)
        out[f"{name}.bias"] = _max_difference(shard.bias.grad, full.bias.grad[bias_index])
    return out


def _compare(parallel: nn.Module, reference: nn.Module, x: torch.Tensor, names: tuple[str, ...]) -> dict:
    """Plain data: forward and input-gradient differences, every parameter's gradient difference,
    and the collectives this rank made forward and backward."""
    # both blocks keep x's shape, so the output's cotangent has it too
    cotangent = torch.randn(x.shape, generator=torch.Generator().manual_seed(99), dtype=x.dtype)
    expected, expected_grad = _forward_backward(reference, x, cotangent)
    got, got_grad = _forward_backward(parallel, x, cotangent)
    return {"forward": _max_difference(got, expected), "input_grad": _max_difference(got_grad, expected_grad),
            "weight_grads": _layer_gradient_differences(parallel, reference, names),
            "forward_calls": list(parallel.comm.forward), "backward_calls": list(parallel.comm.backward)}


def _inputs(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """The same input on every rank."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=dtype)


def mlp_check(features: int = 8, hidden: int = 16, tokens: int = 5, dtype: torch.dtype = torch.float64) -> dict:
    """Run on each rank: the tensor-parallel MLP against the full one (see ``_compare``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same full MLP on every rank
    full = MLP(features, hidden).to(dtype)
    return _compare(TensorParallelMLP(full, rank, world), full, _inputs(tokens, features, dtype=dtype), ("up", "down"))


def attention_check(features: int = 16, heads: int = 8, batch: int = 2, seq: int = 5,
                    dtype: torch.dtype = torch.float64) -> dict:
    """Run on each rank: tensor-parallel attention against the full one (see ``_compare``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    full = Attention(features, heads).to(dtype)
    return _compare(TensorParallelAttention(full, rank, world), full, _inputs(batch, seq, features, dtype=dtype),
                    ("q", "k", "v", "out"))


def wrong_order_check(features: int = 8, hidden: int = 16, tokens: int = 5, dtype: torch.dtype = torch.float64) -> dict:
    """Run on each rank: the wrong-order MLP's error and collectives with the middle all-reduce, and
    its error without it, for GELU and for an identity activation."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = _inputs(tokens, features, dtype=dtype)
    out = {}
    for name, activation in (("gelu", nn.GELU()), ("identity", nn.Identity())):
        torch.manual_seed(2)
        full = MLP(features, hidden, activation).to(dtype)
        with torch.no_grad():
            expected, comm = full(x), CommCount()
            out[name] = {"error": _max_difference(wrong_order_mlp(x, full, rank, world, comm=comm), expected),
                         "forward_calls": comm.forward,
                         "error_without_middle": _max_difference(
                             wrong_order_mlp(x, full, rank, world, middle_all_reduce=False), expected)}
    return out


def tensor_parallel_report() -> dict:
    """Run on each rank: every check above, in one launch."""
    return {"mlp": mlp_check(), "attention": attention_check(), "wrong_order": wrong_order_check()}
