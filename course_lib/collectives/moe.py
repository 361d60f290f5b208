"""Mixture-of-experts expert parallelism on real ranks: route, all-to-all dispatch, combine.

A layer has ``num_experts`` small MLPs and a router. With N ranks, ``num_experts`` is a multiple
of N and rank r holds experts [r E/N, (r+1) E/N); the router is replicated. Every rank routes its
own tokens, sends each (token, expert) assignment to the expert's rank, runs its experts on what
arrived, sends the results back, and adds them up per token, weighted by the gates.

``mixture_of_experts_dispatch`` in ``parallelism.py`` is the same three all-to-alls with one
scalar expert per rank and a fixed routing; this is the layer with a router, top-2 gates and MLPs.

Router convention (Mixtral's): softmax over all E router logits, keep the top-k probabilities,
renormalise them to sum to 1 (the same gates as a softmax over the top-k logits alone).

One forward makes exactly three collectives on every rank, in this order (``FORWARD_COLLECTIVES``):

  1. ``all_to_all_single`` of the per-expert assignment counts (E integers, E/N to each rank),
     so each receiver knows how many rows come from whom and for which of its experts;
  2. ``all_to_all_single`` dispatch: the token rows, grouped by expert, with split sizes;
  3. ``all_to_all_single`` combine: the expert outputs back, with the reverse split sizes.

A rank with no tokens must still make all three (with zero splits): skipping them leaves the
others waiting in the first one (``data_parallel_moe_step``).

``tensor_parallel_mlp`` in ``parallelism.py`` sums partial outputs with an all-reduce; that is
right there because every rank holds the same tokens. Here each rank holds different tokens, so
an all-reduce adds up outputs of different tokens (``all_reduce_combine_error``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

FORWARD_COLLECTIVES = ("all_to_all_single",) * 3
TOP_K = 2


@dataclass(frozen=True)
class MoEWeights:
    """Router and expert weights. Invariant: ``w_in``/``w_out`` hold experts
    [first_expert, first_expert + len(w_in)) of the ``router.shape[1]`` in the layer."""

    router: torch.Tensor  # (d_model, num_experts), the same on every rank
    w_in: torch.Tensor  # (experts held, d_model, hidden)
    w_out: torch.Tensor  # (experts held, hidden, d_model)
    first_expert: int = 0

    @property
    def num_experts(self) -> int:
        return self.router.shape[1]

    def shard(self, rank: int, world_size: int) -> "MoEWeights":
        """The experts rank ``rank`` of ``world_size`` holds (from a full set of weights)."""
        if self.num_experts % world_size:
            raise ValueError(f"num_experts ({self.num_experts}) must be a multiple of the world size ({world_size}).")
        per_rank = self.num_experts // world_size
        held = slice(rank * per_rank, (rank + 1) * per_rank)
        return MoEWeights(self.router, self.w_in[held], self.w_out[held], rank * per_rank)


def make_weights(d_model: int, num_experts: int, hidden: int, seed: int = 0) -> MoEWeights:
    """All experts' weights; the same seed gives the same weights in every process."""
    generator = torch.Generator().manual_seed(seed)
    router = torch.randn(d_model, num_experts, generator=generator) / d_model**0.5
    w_in = torch.randn(num_experts, d_model, hidden, generator=generator) / d_model**0.5
    w_out = torch.randn(num_experts, hidden, d_model, generator=generator) / hidden**0.5
    return MoEWeights(router, w_in, w_out)


def rank_tokens(tokens_per_rank: list[int], d_model: int, seed: int = 1) -> list[torch.Tensor]:
    """Each rank's tokens (``tokens_per_rank[r]`` rows for rank r), the same in every process."""
    tokens = torch.randn(sum(tokens_per_rank), d_model, generator=torch.Generator().manual_seed(seed))
    return list(tokens.split(tokens_per_rank))


def route(x: torch.Tensor, router: torch.Tensor, top_k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts, gates), each (tokens, top_k): softmax over all logits, top-k, renormalised."""
    probabilities = torch.softmax(x @ router, dim=-1)
    gates, experts = probabilities.topk(top_k, dim=-1)
    return experts, gates / gates.sum(dim=-1, keepdim=True)


def expert_mlp(weights: MoEWeights, local_expert: int, x: torch.Tensor) -> torch.Tensor:
    """The ``local_expert``-th expert ``weights`` holds, applied to rows ``x``."""
    return torch.nn.functional.silu(x @ weights.w_in[local_expert]) @ weights.w_out[local_expert]


def dense_moe_forward(weights: MoEWeights, x: torch.Tensor, top_k: int = TOP_K) -> torch.Tensor:
    """Reference on one process: every expert local, no communication."""
    if weights.w_in.shape[0] != weights.num_experts:
        raise ValueError("dense_moe_forward needs every expert's weights, not a shard.")
    experts, gates = route(x, weights.router, top_k)
    out = torch.zeros_like(x)
    for expert in range(weights.num_experts):
        token, slot = (experts == expert).nonzero(as_tuple=True)
        out.index_add_(0, token, gates[token, slot, None] * expert_mlp(weights, expert, x[token]))
    return out


def expert_parallel_moe_forward(shard: MoEWeights, x: torch.Tensor, top_k: int = TOP_K) -> torch.Tensor:
    """This rank's output rows for its tokens ``x`` (possibly none), with ``shard`` this rank's
    experts; makes the three all-to-alls of ``FORWARD_COLLECTIVES`` whatever ``x`` holds."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = shard.w_in.shape[0]
    if per_rank * world != shard.num_experts or shard.first_expert != rank * per_rank:
        raise ValueError(f"rank {rank} must hold experts [{rank * per_rank}, {(rank + 1) * per_rank}): "
                         "pass MoEWeights.shard(rank, world_size).")
    experts, gates = route(x, shard.router, top_k)
    token = torch.arange(x.shape[0]).repeat_interleave(top_k)
    order = torch.argsort(experts.reshape(-1), stable=True)  # by expert, hence by the expert's rank
    token, gate = token[order], gates.reshape(-1)[order]

    send_counts = torch.bincount(experts.reshape(-1), minlength=shard.num_experts)
    receive_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(receive_counts, send_counts)  # [s * per_rank + j]: rows from rank s for my expert j
    send_splits = send_counts.view(world, per_rank).sum(dim=1).tolist()
    receive_splits = receive_counts.view(world, per_rank).sum(dim=1).tolist()

    received = x.new_empty(sum(receive_splits), x.shape[1])
    dist.all_to_all_single(received, x[token], receive_splits, send_splits)
    blocks = received.split(receive_counts.tolist())  # source-major, then my experts in order
    processed = torch.cat([expert_mlp(shard, i % per_rank, block) for i, block in enumerate(blocks)])

    returned = x.new_empty(token.shape[0], x.shape[1])
    dist.all_to_all_single(returned, processed, send_splits, receive_splits)
    return torch.zeros_like(x).index_add_(0, token, gate[:, None] * returned)


def expert_parallel_error(tokens_per_rank: list[int], d_model: int = 8, num_experts: int = 8,
                          hidden: int = 16, seed: int = 0) -> float:
    """Run on every rank: the largest difference between this rank's expert-parallel output and
    the dense reference for its tokens."""
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = make_weights(d_model, num_experts, hidden, seed)
    x = rank_tokens(tokens_per_rank, d_model, seed + 1)[rank]
    out = expert_parallel_moe_forward(weights.shard(rank, world), x)
    return (out - dense_moe_forward(weights, x)).abs().max().item() if x.shape[0] else 0.0


def all_reduce_combine_error(tokens_per_rank: int = 4, d_model: int = 8, num_experts: int = 8,
                             hidden: int = 16, seed: int = 0) -> float:
    """Run on every rank: the wrong combine. Each rank applies its own experts to its own tokens
    and all-reduces the gate-weighted partial outputs; row i then sums expert outputs of row i of
    every rank's tokens, different tokens. Returns the largest difference from the dense reference."""
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = make_weights(d_model, num_experts, hidden, seed)
    shard = weights.shard(rank, world)
    x = rank_tokens([tokens_per_rank] * world, d_model, seed + 1)[rank]
    experts, gates = route(x, weights.router)
    partial = torch.zeros_like(x)
    for local in range(shard.w_in.shape[0]):
        token, slot = (experts == shard.first_expert + local).nonzero(as_tuple=True)
        partial.index_add_(0, token, gates[token, slot, None] * expert_mlp(shard, local, x[token]))
    dist.all_reduce(partial)
    return (partial - dense_moe_forward(weights, x)).abs().max().item()


def data_parallel_moe_step(tokens_per_rank: list[int], dummy_forward: bool, d_model: int = 8,
                           num_experts: int = 8, hidden: int = 16, seed: int = 0) -> float:
    """Run on every rank: one step's MoE forward on this rank's tokens, then the mean squared
    output over every rank's tokens (an all-reduce of [sum, count]).

    A rank with no tokens that skips the forward (``dummy_forward=False``) goes straight to the
    all-reduce while the others wait for it in the count all-to-all: a hang. With
    ``dummy_forward=True`` it runs the forward on zero tokens, joining all three all-to-alls
    with zero splits, and the step completes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = make_weights(d_model, num_experts, hidden, seed)
    x = rank_tokens(tokens_per_rank, d_model, seed + 1)[rank]
    total = torch.zeros(2)
    if x.shape[0] or dummy_forward:
        out = expert_parallel_moe_forward(weights.shard(rank, world), x)
        total = torch.stack([(out**2).sum(), torch.tensor(float(out.numel()))])
    dist.all_reduce(total)
    return (total[0] / total[1]).item()
