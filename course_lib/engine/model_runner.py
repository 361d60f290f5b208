"""Runs one scheduled step on the model: builds the flat batch, moves swapped KV, samples.

The KV cache is one tensor per layer, ``[2, num_blocks, block_size, kv_heads, head_dim]``,
allocated once. Each step's new tokens from all requests become one flat batch; only
requests whose last uncomputed token is in this step get logits (and a sampled token).
"""

from __future__ import annotations

import torch

from course_lib.engine.attention import AttentionMetadata
from course_lib.engine.request import Request
from course_lib.engine.sampler import sample
from course_lib.engine.scheduler import SchedulerOutput
from course_lib.models.llama import LlamaForCausalLM


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, num_cpu_blocks: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        param = next(model.parameters())
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

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: dict[str, Request], block_tables: dict[str, list[int]],
                generators: dict[str, torch.Generator]) -> dict[str, int]:
        """Run the step; return the sampled token of each request that finished its uncomputed tokens."""
        self._copy_blocks(out.swap_out, to_cpu=True)
        self._copy_blocks(out.swap_in, to_cpu=False)
        ids, positions, slots, starts, seq_lens, tables, logit_rows, sampling = [], [], [], [0], [], [], [], []
        for request_id, count in out.num_scheduled_tokens.items():
            request = requests[request_id]
            first, last = request.num_computed_tokens, request.num_computed_tokens + count
            table = block_tables[request_id]
            ids += request.all_token_ids[first:last]
            positions += range(first, last)
            slots += [table[p // self.block_size] * self.block_size + p % self.block_size for p in range(first, last)]
            starts.append(starts[-1] + count)
            seq_lens.append(last)
            tables.append(table)
            if last == request.num_tokens:
                logit_rows.append(starts[-1] - 1)
                sampling.append(request)
        width = max(len(t) for t in tables)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device),
            query_start_loc=starts,
            seq_lens=seq_lens,
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device),
            block_size=self.block_size,
        )
        logits = self.model(torch.tensor(ids, device=device), torch.tensor(positions, device=device), self.kv_caches,
                            meta, torch.tensor(logit_rows, device=device, dtype=torch.long))
        return {r.request_id: sample(row, r.sampling_params, generators.get(r.request_id))
                for r, row in zip(sampling, logits)}
