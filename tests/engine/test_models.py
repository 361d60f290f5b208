"""The model: both forward paths agree, HF checkpoints load, our outputs equal transformers'."""

import json
from dataclasses import replace

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.generate import greedy_reference
from course_lib.models.llama import LlamaConfig
from course_lib.models.loader import ASSETS, load_model, save_pretrained
from course_lib.models.tokenizer import ByteTokenizer


def test_byte_tokenizer_round_trips_any_text():
    tokenizer = ByteTokenizer()
    text = "KV cache: 128 KiB/token — naïve ✓"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids) == text


def test_save_and_load_round_trip(tiny_model, tmp_path):
    save_pretrained(tiny_model, tmp_path, dtype=torch.float64)
    loaded, tokenizer = load_model(tmp_path, dtype=torch.float64)
    assert isinstance(tokenizer, ByteTokenizer)
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(loaded.forward_dense(ids), tiny_model.forward_dense(ids))


def test_loader_rejects_unsupported_and_missing_models(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="not supported"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path / "nothing")


def test_transformers_generate_matches_our_engine_token_for_token(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    reference = transformers.LlamaForCausalLM(config).double().eval()
    reference.save_pretrained(tmp_path)
    model, tokenizer = load_model(tmp_path, dtype=torch.float64)
    assert tokenizer is None  # no tokenizer files: prompts go in as token ids
    prompts = [[0, 5, 9, 33, 70], [0, 44], [0, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    llm = LLM(model, max_model_len=64, num_gpu_blocks=32, block_size=4, max_num_batched_tokens=8,
              dtype=torch.float64)
    ours = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for prompt, output in zip(prompts, ours):
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                      min_new_tokens=12, pad_token_id=2)[0, len(prompt):].tolist()
        assert output.outputs[0].token_ids == expected
        assert greedy_reference(model, prompt, 12) == expected


def test_shipped_model_writes_python_help_text():
    card = json.loads((ASSETS / "tiny-llama" / "training.json").read_text())
    assert card["held_out_bits_per_byte"] < 2.0
    llm = LLM("tiny-llama", max_model_len=256, num_gpu_blocks=32)
    text = llm.generate(["The for statement"], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0].text
    assert len(text) >= 20 and text.isascii() and " the " in text


def test_changing_the_eos_id_alone_says_to_give_both():
    with pytest.raises(ValueError, match=r"give both \(e.g. dataclasses.replace\(config, eos_token_id=5, eos_token_ids=\(5,\)\)\)"):
        replace(LlamaConfig(), eos_token_id=5)
    assert replace(LlamaConfig(), eos_token_id=5, eos_token_ids=(5,)).eos_token_ids == (5,)
