"""Runs one scheduled step on the model: builds the flat batch, moves swapped KV, samples.

The KV cache is one tensor per layer, ``[2, num_blocks, block_size, kv_heads, head_dim]``,
allocated once. The flat batch is plain lists (``StepBatch``), so the same step can be sent to
tensor-parallel ranks (``engine/tensor_parallel_runner.py``), each running its own ``ModelRunner``.
Each step's new tokens from all requests become one flat batch; only
requests whose last uncomputed token is in this step get logits (and a sampled token).
A request verifying ``j`` speculative drafts gets ``j + 1`` logits rows from the same pass (its
last token's and each draft's), and the rejection sampler turns them into 1 to ``j + 1`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.engine.attention import build_metadata
from course_lib.engine.request import Request
from course_lib.engine.scheduler import SchedulerOutput
from course_lib.engine.step_sampler import sample_step
from course_lib.models.llama import LlamaForCausalLM

ATTENTION_BACKENDS = ("torch", "triton", "cpu")


def _metadata_builder(backend: str):
    """The per-step metadata constructor of an attention backend."""
    if backend == "torch":
        return build_metadata
    if backend == "triton":
        try:
            from course_lib.engine.triton_attention import TritonAttentionMetadata
        except ImportError as error:
            raise ImportError("attention_backend='triton' needs the triton package (Linux); "
                              "use attention_backend='torch'.") from error
        return TritonAttentionMetadata.build
    if backend == "cpu":
        from course_lib.engine.cpu_attention import CpuAttentionMetadata
        return CpuAttentionMetadata.build
    raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {backend!r}.")


@dataclass
class StepBatch:
    """One step's flat batch as plain lists (no tensors, no requests): what every tensor-parallel
    rank receives to build its own tensors on its own device."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]  # where each token's K/V goes: block id * block_size + offset
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    logits_indices: list[int]
    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    kv_offload: list[tuple[int, int]] = field(default_factory=list)  # (GPU block, offload-tier CPU block)
    kv_reload: list[tuple[int, int]] = field(default_factory=list)  # (offload-tier CPU block, GPU block)


@dataclass
class ModelInput:
    """A step as ``prepare`` builds it: the flat batch, and who gets the logits rows."""

    batch: StepBatch
    sampling: list[Request]  # requests that get a token this step, in logits row order
    drafts: list[list[int]] = field(default_factory=list)  # per sampling request: drafts it verifies


def prepare(out: SchedulerOutput, requests: dict[str, Request], block_tables: dict[str, list[int]],
            block_size: int) -> ModelInput:
    """Flatten the step's new tokens, their positions and slots, and the attention metadata's lists.
    Requests decoding one token come first, shortest context first: the attention backend's
    buckets of them are then runs of consecutive rows (slices, not gathers, in every layer)."""
    ids, positions, slots, query_lens, seq_lens, tables, logit_rows, sampling = [], [], [], [], [], [], [], []
    all_drafts = []
    scheduled = out.num_scheduled_tokens

    def decode_first(request_id: str) -> tuple[bool, int]:
        return scheduled[request_id] != 1, requests[request_id].num_computed_tokens

    for request_id in sorted(scheduled, key=decode_first):
        count = scheduled[request_id]
        request = requests[request_id]
        first, last = request.num_computed_tokens, request.num_computed_tokens + count
        drafts = out.spec_token_ids.get(request_id, [])
        table = block_tables[request_id]
        ids += request.token_ids(first, last - len(drafts)) + drafts
        positions += range(first, last)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(first, last)]
        query_lens.append(count)
        seq_lens.append(last)
        tables.append(table)
        if last - len(drafts) == request.num_tokens:
            logit_rows += range(len(ids) - 1 - len(drafts), len(ids))
            sampling.append(request)
            all_drafts.append(drafts)
    batch = StepBatch(ids, positions, slots, query_lens, seq_lens, tables, logit_rows, out.swap_out, out.swap_in,
                      out.kv_offload, out.kv_reload)
    return ModelInput(batch, sampling, all_drafts)


class ModelRunner:
    """The model and its paged KV cache on one device: ``[2, num_blocks, block_size, kv_heads,
    head_dim]`` per layer, where kv_heads are the model's attention layers' own (a tensor-parallel
    shard's share), in ``kv_cache_dtype`` (default the model's; ``torch.float8_e4m3fn`` for an fp8
    cache, whose per-layer scales the attention layers carry as ``kv_scales``)."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 attention_backend: str = "torch", num_offload_blocks: int = 0,
                 kv_cache_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.block_size = block_size
        param = next(model.parameters())
        self.build_metadata = _metadata_builder(attention_backend)
        attn = model.model.layers[0].self_attn
        shape = (2, num_blocks, block_size, attn.num_kv_heads, attn.head_dim)
        layers = model.config.num_hidden_layers
        dtype = kv_cache_dtype or param.dtype
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=param.device) for _ in range(layers)]
        cpu_shape = (2, num_cpu_blocks, *shape[2:])
        self.cpu_caches = [torch.zeros(cpu_shape, dtype=dtype) for _ in range(layers)] if num_cpu_blocks else []
        self.device = param.device
        # The KV offload tier's CPU blocks: tensors of their own, apart from the swap space above.
        self.offload_caches = [torch.zeros((2, num_offload_blocks, *shape[2:]), dtype=kv.dtype)
                               for kv in self.kv_caches] if num_offload_blocks else []

    def _copy_blocks(self, pairs: list[tuple[int, int]], to_cpu: bool, cpu_caches: list | None = None) -> None:
        if not pairs:
            return
        src, dst = (torch.tensor(ids) for ids in zip(*pairs))
        for gpu, cpu in zip(self.kv_caches, self.cpu_caches if cpu_caches is None else cpu_caches):
            if to_cpu:
                cpu[:, dst] = gpu[:, src.to(self.device)].cpu()
            else:
                gpu[:, dst.to(self.device)] = cpu[:, src].to(self.device)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Move swapped and offloaded KV, then run the forward pass: logits at ``batch.logits_indices``.
        Every GPU->CPU copy runs before any CPU->GPU copy: a block popped for reuse this step is
        read out before a reload or the forward pass writes it."""
        self._copy_blocks(batch.kv_offload, to_cpu=True, cpu_caches=self.offload_caches)
        self._copy_blocks(batch.swap_out, to_cpu=True)
        self._copy_blocks(batch.kv_reload, to_cpu=False, cpu_caches=self.offload_caches)
        self._copy_blocks(batch.swap_in, to_cpu=False)
        device = self.device
        metadata = self.build_metadata(batch.slots, batch.query_lens, batch.seq_lens, batch.block_tables,
                                       self.block_size, device)
        return self.model(torch.tensor(batch.input_ids, device=device), torch.tensor(batch.positions, device=device),
                          self.kv_caches, metadata,
                          torch.tensor(batch.logits_indices, device=device, dtype=torch.long))

    def execute(self, step: ModelInput, generators: dict[str, torch.Generator]) -> tuple[dict, dict]:
        """The forward pass, then sampling: tokens and logprobs per request (``step_sampler.sample_step``)."""
        return sample_step(self.forward(step.batch), step, generators)
