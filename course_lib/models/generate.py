"""Reference generation: the plain model, one request at a time, no KV cache at all.

Every token re-runs the whole sequence through ``forward_dense``. It is slow and obviously
right, which is the point: the engine's greedy outputs must equal these token for token.
"""

from __future__ import annotations

import torch

from course_lib.models.llama import LlamaForCausalLM


@torch.inference_mode()
def greedy_reference(model: LlamaForCausalLM, prompt_ids: list[int], max_tokens: int,
                     eos_token_id: int | None = None, max_model_len: int | None = None) -> list[int]:
    """Greedy continuation of ``prompt_ids``: stops at EOS, ``max_tokens`` or ``max_model_len`` tokens."""
    device = next(model.parameters()).device
    tokens, out = list(prompt_ids), []
    limit = max_model_len or model.config.max_position_embeddings
    while len(out) < max_tokens and len(tokens) < limit + 1:
        logits = model.forward_dense(torch.tensor([tokens], device=device))[0, -1]
        token = int(torch.argmax(logits))
        out.append(token)
        tokens.append(token)
        if token == eos_token_id or len(tokens) >= limit:
            break
    return out
