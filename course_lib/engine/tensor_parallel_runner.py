"""The model runner for ``tensor_parallel_size > 1``: one worker per rank, the scheduler stays here.

As in vLLM V1's multiprocess executor, this process keeps the scheduler and the KV cache manager;
N rank workers (a ``RankPool``: gloo on CPUs, NCCL with a GPU per rank) each hold one shard of
the model (``models/tensor_parallel_llama.py``) and a ``ModelRunner`` whose paged KV cache stores
only that rank's KV heads. Every block id means the same block on every rank: the one block table
this process keeps indexes all N caches.

Each step, every rank receives the same ``StepBatch`` (plain lists), runs its forward pass (two
all-reduces per layer join the ranks' partial sums) and rank 0 sends back the logits, which this
process samples with the code TP=1 uses. (vLLM differs in the plumbing: it broadcasts the
scheduler's output through a shared-memory queue to workers that keep each request's state
between steps, samples inside the workers and returns token ids.) ``all_reduces_per_step`` is
what each rank counted in its last forward pass.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives.rank_pool import RankPool
from course_lib.engine.backend import resolve_attention_backend
from course_lib.engine.model_runner import ModelInput, ModelRunner, StepBatch
from course_lib.engine.step_sampler import sample_step
from course_lib.models.llama import LlamaForCausalLM
from course_lib.models.tensor_parallel_llama import shard_llama_


class _Worker:
    """One rank's shard, its runner, and the all-reduces its last forward pass made."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, num_cpu_blocks: int,
                 attention_backend: str | None, dtype: torch.dtype, backend: str, num_offload_blocks: int = 0) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        self.comm = shard_llama_(model, rank, world)  # this process's copy of the model (fork: copy on write)
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        model.to(device=device, dtype=dtype).eval()
        self.attention_backend = resolve_attention_backend(attention_backend, model, block_size)
        self.runner = ModelRunner(model, num_blocks, block_size, num_cpu_blocks, self.attention_backend,
                                  num_offload_blocks)  # each rank offloads its own KV heads' share


def _forward(worker: _Worker, batch: StepBatch) -> tuple[torch.Tensor | None, int]:
    worker.comm.forward.clear()
    logits = worker.runner.forward(batch)
    return (logits if dist.get_rank() == 0 else None), len(worker.comm.forward)


def _describe(worker: _Worker) -> dict:
    attn = worker.runner.model.model.layers[0].self_attn
    return {"attention_backend": worker.attention_backend, "device": str(worker.runner.device),
            "num_heads": attn.num_heads, "num_kv_heads": attn.num_kv_heads,
            "kv_cache_shape": tuple(worker.runner.kv_caches[0].shape)}


class TensorParallelRunner:
    """``ModelRunner``'s ``execute``, run over ``tensor_parallel_size`` rank workers.

    ``model`` must be on the CPU (each worker moves its shard to its own device and ``dtype``);
    ``timeout_s`` bounds every step, so a rank that hangs or dies raises instead of stalling the
    caller. An exception every rank got past (a batch every rank refuses) is raised as
    ``RankFailure`` and the workers serve the next step; Ctrl-C during a step leaves it to finish
    on the ranks, its replies dropped by the next step (``RankPool``). Once the workers are stopped
    (a death, a rank left inside an all-reduce, a timeout, or ``close``) ``execute`` raises, naming why."""

    def __init__(self, model: LlamaForCausalLM, tensor_parallel_size: int, num_blocks: int, block_size: int,
                 num_cpu_blocks: int, attention_backend: str | None, dtype: torch.dtype, backend: str,
                 timeout_s: float = 60.0, num_offload_blocks: int = 0) -> None:
        self.pool = RankPool(tensor_parallel_size, _Worker, model, num_blocks, block_size, num_cpu_blocks,
                             attention_backend, dtype, backend, num_offload_blocks, backend=backend,
                             timeout_s=timeout_s)
        self.ranks = self.pool.call(_describe)
        self.attention_backend = self.ranks[0]["attention_backend"]
        self.all_reduces_per_step = 0

    def check_open(self) -> None:
        if self.pool.closed:
            raise RuntimeError(f"This LLM's tensor-parallel workers were stopped {self.pool.closed_because}; "
                               "create a new LLM to go on.")

    def execute(self, step: ModelInput, generators: dict[str, torch.Generator]) -> tuple[dict, dict]:
        self.check_open()
        results = self.pool.call(_forward, step.batch)
        counts = {count for _, count in results}
        if len(counts) != 1:  # every rank runs the same layers: a difference is a bug, not noise
            raise RuntimeError(f"The ranks made different numbers of all-reduces in one step: {sorted(counts)}.")
        self.all_reduces_per_step = counts.pop()
        return sample_step(results[0][0], step, generators)

    def close(self) -> None:
        self.pool.close()
