"""One tensor-parallel rank's share of a ``LlamaForCausalLM``, for inference, as vLLM shards its layers.

Per decoder layer, with N ranks:
  * attention: ``q_proj``, ``k_proj``, ``v_proj`` column-parallel by heads (rank r keeps query heads
    r*H/N .. and KV heads r*KV/N .., so each query head's KV head stays on its rank and the rank's
    paged KV cache holds only its KV heads); ``o_proj`` row-parallel, its partial sums all-reduced;
  * MLP: ``gate_proj`` and ``up_proj`` column-parallel, ``down_proj`` row-parallel, all-reduced.
Embeddings, norms and the LM head are replicated (vLLM also splits the embedding and LM head by
vocabulary, which saves memory on big vocabularies and adds a collective). So one forward pass
makes exactly two all-reduces per layer (the g of each block, ``collectives/tensor_parallel.py``), and every rank
ends with the same hidden states and logits as the unsharded model, up to float rounding (the sum
over ranks adds the same products in a different order). Forward only: the column-parallel
layers skip f, whose forward is the identity, and nothing here trains.

Biases (Llama's attention_bias/mlp_bias, Qwen2's q/k/v) follow their layers: a column-parallel
bias is split with its rows, a row-parallel one (o_proj, down_proj) is added once, after the sum.

Every rank needs whole heads: a TP size must divide the heads and the KV heads (vLLM replicates
KV heads when there are fewer than ranks; this refuses instead).
"""

from __future__ import annotations

from course_lib.collectives.tensor_parallel import ColumnParallelLinear, CommCount, RowParallelLinear
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM


def check_tensor_parallel_size(config: LlamaConfig, tensor_parallel_size: int) -> None:
    """Raise ``ValueError`` saying what to change unless the heads, KV heads and MLP width all divide
    by ``tensor_parallel_size``."""
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be a positive int, got {tensor_parallel_size!r}.")
    sizes = {"attention heads (num_attention_heads)": config.num_attention_heads,
             "KV heads (num_key_value_heads)": config.num_key_value_heads,
             "MLP width (intermediate_size)": config.intermediate_size}
    for what, size in sizes.items():
        if size % tensor_parallel_size:
            fits = [n for n in range(1, config.num_key_value_heads + 1) if all(s % n == 0 for s in sizes.values())]
            raise ValueError(f"The model's {size} {what} do not divide by tensor_parallel_size="
                             f"{tensor_parallel_size}: every rank needs whole heads. Use a size that divides "
                             f"{config.num_attention_heads} heads, {config.num_key_value_heads} KV heads and "
                             f"{config.intermediate_size} MLP features: {', '.join(map(str, fits))}.")


def shard_llama_(model: LlamaForCausalLM, rank: int, tensor_parallel_size: int, group=None) -> CommCount:
    """Replace ``model``'s projections, in place, by rank ``rank``'s shards (see the module
    docstring). Returns the ``CommCount`` every row-parallel layer records its all-reduce in."""
    check_tensor_parallel_size(model.config, tensor_parallel_size)
    comm = CommCount()

    def column(layer):
        return ColumnParallelLinear(layer, rank, tensor_parallel_size, group, comm, copy_input=False)

    def row(layer):
        return RowParallelLinear(layer, rank, tensor_parallel_size, group, comm)

    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj = (column(attn.q_proj), column(attn.k_proj),
                                                              column(attn.v_proj), row(attn.o_proj))
        attn.num_heads //= tensor_parallel_size
        attn.num_kv_heads //= tensor_parallel_size
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = column(mlp.gate_proj), column(mlp.up_proj), row(mlp.down_proj)
    return comm
