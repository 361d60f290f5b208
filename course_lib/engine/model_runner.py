"""Runs one scheduled step on the model: builds the flat batch, moves swapped KV, samples.

The KV cache is one tensor per layer, ``[2, num_blocks, block_size, kv_heads, head_dim]``,
allocated once. Each step's new tokens from all requests become one flat batch; only
requests whose last uncomputed token is in this step get logits (and a sampled token).
A request verifying ``j`` speculative drafts gets ``j + 1`` logits rows from the same pass (its
last token's and each draft's), and the rejection sampler turns them into 1 to ``j + 1`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.engine.attention import AttentionMetadata, build_metadata
from course_lib.engine.rejection_sampler import rejection_sample
from course_lib.engine.request import Request
from course_lib.engine.sampler import sample
from course_lib.engine.scheduler import SchedulerOutput
from course_lib.models.llama import LlamaForCausalLM

ATTENTION_BACKENDS = ("torch", "triton")


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
    raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {backend!r}.")


@dataclass
class ModelInput:
    """Everything one forward pass needs, built by ``ModelRunner.prepare``."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata  # or the Triton backend's metadata: same write/attend methods
    logits_indices: torch.Tensor
    sampling: list[Request]  # requests that get a token this step, in logits row order
    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    drafts: list[list[int]] = field(default_factory=list)  # per sampling request: drafts it verifies


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 attention_backend: str = "torch") -> None:
        self.model = model
        self.block_size = block_size
        param = next(model.parameters())
        self.build_metadata = _metadata_builder(attention_backend)
        c = model.config
        shape = (2, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in range(c.num_hidden_layers)]
        cpu_shape = (2, num_cpu_blocks, *shape[2:])
        self.cpu_caches = [torch.zeros(cpu_shape, dtype=param.dtype) for _ in range(c.num_hidden_layers)] if num_cpu_blocks else []
        self.device = param.device

    def _copy_blocks(self, pairs: list[tuple[int, int]], to_cpu: bool) -> None:
        if not pairs:
            return
        src, dst = (torch.tensor(ids) for ids in zip(*pairs))
        for gpu, cpu in zip(self.kv_caches, self.cpu_caches):
            if to_cpu:
                cpu[:, dst] = gpu[:, src.to(self.device)].cpu()
            else:
                gpu[:, dst.to(self.device)] = cpu[:, src].to(self.device)

    def prepare(self, out: SchedulerOutput, requests: dict[str, Request],
                block_tables: dict[str, list[int]]) -> ModelInput:
        """Flatten the step's new tokens, their positions and slots, and the attention metadata."""
        ids, positions, slots, query_lens, seq_lens, tables, logit_rows, sampling = [], [], [], [], [], [], [], []
        all_drafts = []
        for request_id, count in out.num_scheduled_tokens.items():
            request = requests[request_id]
            first, last = request.num_computed_tokens, request.num_computed_tokens + count
            drafts = out.spec_token_ids.get(request_id, [])
            table = block_tables[request_id]
            ids += request.token_ids(first, last - len(drafts)) + drafts
            positions += range(first, last)
            slots += [table[p // self.block_size] * self.block_size + p % self.block_size for p in range(first, last)]
            query_lens.append(count)
            seq_lens.append(last)
            tables.append(table)
            if last - len(drafts) == request.num_tokens:
                logit_rows += range(len(ids) - 1 - len(drafts), len(ids))
                sampling.append(request)
                all_drafts.append(drafts)
        device = self.device
        return ModelInput(
            torch.tensor(ids, device=device), torch.tensor(positions, device=device),
            self.build_metadata(slots, query_lens, seq_lens, tables, self.block_size, device),
            torch.tensor(logit_rows, device=device, dtype=torch.long), sampling, out.swap_out, out.swap_in,
            all_drafts,
        )

    @torch.inference_mode()
    def execute(self, batch: ModelInput, generators: dict[str, torch.Generator]) -> dict[str, int | list[int]]:
        """Move swapped KV, run the forward pass, and sample for every request that reached its end:
        one token, or (with drafts) the verified run of drafts plus one."""
        self._copy_blocks(batch.swap_out, to_cpu=True)
        self._copy_blocks(batch.swap_in, to_cpu=False)
        logits = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.metadata, batch.logits_indices)
        drafts_of = batch.drafts or [[]] * len(batch.sampling)
        sampled, row = {}, 0
        for request, drafts in zip(batch.sampling, drafts_of):
            generator = generators.get(request.request_id)
            if not drafts:
                sampled[request.request_id] = sample(logits[row], request.sampling_params, generator)
            else:
                probs = None if request.spec_probs is None else request.spec_probs[:len(drafts)]
                sampled[request.request_id], _ = rejection_sample(logits[row:row + len(drafts) + 1], drafts, probs,
                                                                  request.sampling_params, generator)
            row += len(drafts) + 1
        return sampled
