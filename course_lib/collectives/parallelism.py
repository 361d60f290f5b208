"""Which parallelism uses which collective: each strategy's communication in a minimal real run.

Every function runs on each rank (through ``run_on_ranks``), does one step of its strategy on
tiny tensors, and returns its largest difference from the same computation done on one rank,
relative to the largest value (``relative_difference``): a correct decomposition returns 0, or
float32 rounding (about 1e-7) where it adds the same numbers in another order.

  data parallel (DDP)   all-reduce the gradients, then divide by N (the average)
  FSDP                  all-gather the parameter shards before use; reduce-scatter the gradients
  tensor parallel       one all-reduce after a column-parallel then row-parallel pair of matmuls
  mixture of experts    all-to-all the tokens to their experts' ranks, all-to-all the results back
  pipeline parallel     send/receive activations between neighbouring stages: no collective
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives.primitives import all_gather_flat, reduce_scatter_flat

FEATURES = 8


def relative_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference over the largest absolute expected value (0 for equal tensors)."""
    return ((got - expected).abs().max() / expected.abs().max()).item()


def _shared(*shape: int, seed: int) -> torch.Tensor:
    """The same random tensor on every rank (same seed)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _full_batch(world: int, rows_per_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _shared(world * rows_per_rank, FEATURES, seed=1), _shared(world * rows_per_rank, seed=2)


def _gradient(weight: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Gradient of the mean squared error of a linear model."""
    weight = weight.detach().requires_grad_()
    ((inputs @ weight - targets) ** 2).mean().backward()
    return weight.grad


def data_parallel_step(rows_per_rank: int = 4) -> float:
    """DDP: each rank has its own slice of the batch; all-reduce then divide gives the full-batch gradient."""
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs, targets = _full_batch(world, rows_per_rank)
    weight = _shared(FEATURES, seed=0)
    mine = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
    gradient = _gradient(weight, inputs[mine], targets[mine])
    dist.all_reduce(gradient)
    gradient /= world
    return relative_difference(gradient, _gradient(weight, inputs, targets))


def fully_sharded_step(rows_per_rank: int = 4) -> float:
    """FSDP: each rank stores 1/N of the weights; all-gather them to compute, reduce-scatter the gradient."""
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs, targets = _full_batch(world, rows_per_rank)
    full_weight = _shared(FEATURES * world, seed=0)  # FEATURES x N weights, so they shard evenly
    inputs = inputs.repeat(1, world)
    shard = full_weight.chunk(world)[rank].clone()  # all a rank keeps between steps
    weight = torch.empty_like(full_weight)
    all_gather_flat(weight, shard)
    mine = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
    gradient_shard = torch.empty_like(shard)
    reduce_scatter_flat(gradient_shard, _gradient(weight, inputs[mine], targets[mine]))
    gradient_shard /= world
    expected = _gradient(full_weight, inputs, targets).chunk(world)[rank]
    return relative_difference(gradient_shard, expected)


def tensor_parallel_mlp(tokens: int = 5, hidden: int = 16) -> float:
    """TP: W1 split by columns and W2 by rows; each rank's partial output, all-reduced, is the full MLP."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = _shared(tokens, FEATURES, seed=3)
    w1, w2 = _shared(FEATURES, hidden * world, seed=4), _shared(hidden * world, FEATURES, seed=5)
    columns = slice(rank * hidden, (rank + 1) * hidden)
    partial = torch.relu(x @ w1[:, columns]) @ w2[columns, :]  # no communication until here
    dist.all_reduce(partial)
    return relative_difference(partial, torch.relu(x @ w1) @ w2)


def mixture_of_experts_dispatch(tokens_per_rank: int = 6) -> float:
    """MoE: rank e holds expert e (it multiplies by e + 1). Three all-to-alls: the token counts
    first (so each rank can size its receive buffer), then the tokens to their expert's rank
    (dispatch), then the results back (combine). Summing instead would mix different tokens."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = _shared(world * tokens_per_rank, seed=6)[rank * tokens_per_rank:(rank + 1) * tokens_per_rank]
    expert = torch.randint(0, world, (tokens_per_rank,), generator=torch.Generator().manual_seed(7 + rank))
    order = torch.argsort(expert, stable=True)  # group my tokens by destination rank
    send_counts = torch.bincount(expert, minlength=world)
    receive_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(receive_counts, send_counts)  # first tell everyone how many are coming
    arrived = torch.empty(int(receive_counts.sum()))
    dist.all_to_all_single(arrived, tokens[order], receive_counts.tolist(), send_counts.tolist())
    processed = arrived * (rank + 1)  # this rank's expert
    returned = torch.empty(tokens_per_rank)
    dist.all_to_all_single(returned, processed, send_counts.tolist(), receive_counts.tolist())
    combined = torch.empty(tokens_per_rank)
    combined[order] = returned
    return relative_difference(combined, tokens * (expert + 1))


def pipeline_forward(micro_batch: int = 3) -> float:
    """Pipeline: rank r owns layer r; activations travel by send/recv, stage to stage."""
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = [_shared(FEATURES, FEATURES, seed=10 + i) / FEATURES**0.5 for i in range(world)]
    first_input = _shared(micro_batch, FEATURES, seed=9)
    activations = first_input if rank == 0 else torch.empty(micro_batch, FEATURES)
    if rank > 0:
        dist.recv(activations, src=rank - 1)
    activations = torch.tanh(activations @ layers[rank])
    if rank < world - 1:
        dist.send(activations, dst=rank + 1)
        return 0.0  # only the last stage holds the output
    expected = first_input
    for layer in layers:
        expected = torch.tanh(expected @ layer)
    return relative_difference(activations, expected)


STRATEGIES = {
    "data parallel (DDP): all-reduce": data_parallel_step,
    "fully sharded (FSDP): all-gather + reduce-scatter": fully_sharded_step,
    "tensor parallel: all-reduce": tensor_parallel_mlp,
    "mixture of experts: all-to-all": mixture_of_experts_dispatch,
    "pipeline parallel: send/recv": pipeline_forward,
}


def run_every_strategy() -> dict[str, float]:
    """Each strategy's largest relative difference from its one-rank computation, on this rank."""
    return {name: strategy() for name, strategy in STRATEGIES.items()}
