"""Checkpoints written by Hugging Face ``transformers`` load with their maths intact: rotary theta and
scaling, biases, tied embeddings, an explicit head_dim. Our dense logits equal transformers' and the
engine's greedy tokens equal ``generate``'s; settings not implemented are refused by name.

Weights are random but sharp (attention that depends on position, biases that are not zero, logits
with clear winners), and each case also checks that the setting it tests changes the logits, so a
loader that ignored it would fail.
"""

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import run_on_ranks
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM, RopeScaling
from course_lib.models.loader import load_model, save_pretrained
from course_lib.models.tensor_parallel_llama import shard_llama_

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=2)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # head_dim 16: all three regimes


def sharpen_(model: torch.nn.Module, seed: int) -> None:
    """Random weights that make attention, biases and greedy choices matter."""
    generator = torch.Generator().manual_seed(seed)
    amplified = ("q_proj", "k_proj", "o_proj", "down_proj", "lm_head")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name == "model.norm.weight":  # sharp logits, tied embeddings included
                param.fill_(4.0)
            elif "norm" in name:
                continue
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "embed" in name:  # small beside the layers' outputs: a tied model does not just echo its input
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            else:
                gain = 3.0 if name.split(".")[-2] in amplified else 1.0
                param.copy_(torch.randn(param.shape, generator=generator) * gain * param.shape[1] ** -0.5)


def write_checkpoint(folder, architecture: str = "llama", old_format: bool = False, seed: int = 0, **fields):
    """Save a random float32 transformers model to ``folder``; return it. ``old_format`` rewrites its
    ``config.json`` the transformers 4 way (top-level ``rope_theta`` and ``rope_scaling``)."""
    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                 "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[architecture]
    reference = model_class(config_class(**{**SHAPE, **fields})).float().eval()
    sharpen_(reference, seed)
    reference.save_pretrained(folder)
    if old_format:
        data = json.loads((folder / "config.json").read_text())
        rope = data.pop("rope_parameters")
        data["rope_theta"] = rope.pop("rope_theta")
        data["rope_scaling"] = rope if rope["rope_type"] != "default" else None
        (folder / "config.json").write_text(json.dumps(data))
    return reference


def reference_tokens(reference, prompt: list[int], max_tokens: int) -> list[int]:
    out = reference.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=2,
                             eos_token_id=None)  # ignore EOS (min_new_tokens would forbid it instead)
    return out[0, len(prompt):].tolist()


def dense_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.forward_dense(ids)


def with_config(model: LlamaForCausalLM, **changes) -> LlamaForCausalLM:
    """``model``'s weights (those that fit) under a config with ``changes``: what a loader ignoring them builds."""
    other = LlamaForCausalLM(dataclasses.replace(model.config, **changes)).eval()
    other.load_state_dict(model.state_dict(), strict=False)
    return other


CASES = {  # name: (write_checkpoint arguments, config changes that must alter the logits, prompt length, new tokens)
    "theta_500k": (dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
                   dict(rope_theta=10000.0), 12, 20),
    "theta_500k_old_format": (dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                                   old_format=True), dict(rope_theta=10000.0), 12, 20),
    "llama3_scaling": (dict(rope_parameters=LLAMA3), dict(rope_scaling=None), 40, 80),
    "llama3_scaling_old_format": (dict(rope_parameters=LLAMA3, old_format=True), dict(rope_scaling=None), 40, 80),
    "linear_scaling": (dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
                       dict(rope_scaling=None), 20, 40),
    "qwen2_biases_tied": (dict(architecture="qwen2", tie_word_embeddings=True), dict(model_type="llama"), 12, 20),
    "llama_attention_and_mlp_bias": (dict(attention_bias=True, mlp_bias=True),
                                     dict(attention_bias=False, mlp_bias=False), 12, 20),
    "llama_tied": (dict(tie_word_embeddings=True), None, 12, 20),
    "explicit_head_dim": (dict(head_dim=32), None, 12, 20),
}


@pytest.mark.parametrize("case", CASES)
def test_checkpoint_gives_transformers_logits_and_greedy_tokens(case, tmp_path):
    fields, ignored, prompt_len, new_tokens = CASES[case]
    reference = write_checkpoint(tmp_path, **fields)
    model, _ = load_model(tmp_path)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SHAPE["vocab_size"], (2, prompt_len + new_tokens), generator=generator)
    ours = dense_logits(model, ids)
    with torch.no_grad():
        expected = reference(ids).logits
    torch.testing.assert_close(ours, expected, atol=2e-4, rtol=1e-4)
    if ignored is not None:  # the setting matters for these weights: a loader ignoring it would fail above
        assert (dense_logits(with_config(model, **ignored), ids) - expected).abs().max() > 0.1

    prompts = [ids[row, :prompt_len - 4 * row].tolist() for row in range(2)] + [[0, 7, 9]]
    llm = LLM(model, device="cpu", max_model_len=prompt_len + new_tokens + 8, dtype=torch.float32)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        tokens = output.outputs[0].token_ids
        assert tokens == reference_tokens(reference, prompt, new_tokens)
        assert len(set(tokens)) > 3  # a greedy path that varies, not one token repeated


def test_loaded_settings_are_the_checkpoints(tmp_path):
    write_checkpoint(tmp_path, rope_parameters=LLAMA3, attention_bias=True, head_dim=32)
    config = load_model(tmp_path)[0].config
    assert config.rope_theta == 10000.0 and config.head_dim == 32 and config.attention_bias
    assert dataclasses.asdict(config.rope_scaling) == {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    write_checkpoint(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, old_format=True)
    assert load_model(tmp_path)[0].config.rope_theta == 500000.0


def test_every_eos_id_of_config_and_generation_config_is_kept(tmp_path):
    write_checkpoint(tmp_path, eos_token_id=[1, 5])
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 1]}))
    config = load_model(tmp_path)[0].config
    assert config.eos_token_id == 1 and config.eos_token_ids == (1, 5, 7)
    assert LlamaConfig(eos_token_id=4).eos_token_ids == (4,)


@pytest.mark.parametrize("edit, field", [
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}, "dynamic"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}}, "yarn"),
    ({"rope_parameters": None, "rope_scaling": {"type": "longrope", "factor": 2.0}}, "longrope"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {**LLAMA3, "high_freq_factor": None}}, "high_freq_factor"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "rope_parameters"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
    ({"architectures": ["Qwen2ForCausalLM"], "layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
])
def test_settings_that_change_the_maths_and_are_not_implemented_are_refused(edit, field, tmp_path):
    data = {**transformers.LlamaConfig(**SHAPE).to_dict(), "architectures": ["LlamaForCausalLM"], **edit}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=field):
        load_model(tmp_path)


@pytest.mark.parametrize("changes", [
    dict(rope_theta=500000.0, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 32), attention_bias=True,
         mlp_bias=True, head_dim=32, eos_token_id=1, eos_token_ids=(1, 5)),
    dict(model_type="qwen2", tie_word_embeddings=True, rope_scaling=RopeScaling("linear", 2.0)),
])
def test_course_saved_models_reload_identically_and_load_in_transformers(changes, tmp_path):
    shape = {k: v for k, v in SHAPE.items() if k != "pad_token_id"}
    model = LlamaForCausalLM(LlamaConfig(**{**shape, **changes})).eval()
    sharpen_(model, seed=3)
    save_pretrained(model, tmp_path, dtype=torch.float32)
    loaded, _ = load_model(tmp_path)
    assert loaded.config == model.config
    ids = torch.randint(3, SHAPE["vocab_size"], (2, 80), generator=torch.Generator().manual_seed(2))
    assert torch.equal(dense_logits(loaded, ids), dense_logits(model, ids))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(reference(ids).logits, dense_logits(model, ids), atol=2e-4, rtol=1e-4)


def biased_model_sharded_logit_difference() -> float:
    """On each of 2 ranks: how far the sharded model's logits are from the full model's."""
    shape = {k: v for k, v in SHAPE.items() if k != "pad_token_id"}
    model = LlamaForCausalLM(LlamaConfig(**shape, attention_bias=True, mlp_bias=True, head_dim=32)).eval()
    sharpen_(model, seed=4)
    ids = torch.randint(3, SHAPE["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(2))
    full = dense_logits(model, ids)
    shard_llama_(model, dist.get_rank(), dist.get_world_size())
    return (dense_logits(model, ids) - full).abs().max().item()


def test_tensor_parallel_shards_biases_and_adds_row_parallel_ones_once():
    """q/k/v/gate/up biases are split with their rows; o_proj's and down_proj's are added after the sum."""
    assert max(run_on_ranks(biased_model_sharded_logit_difference, 2, timeout_s=60)) < 1e-3
