"""Save and load Hugging Face-style Llama folders (config.json + model.safetensors).

``load_model("tiny-llama")`` loads a model shipped in ``assets/``; any other argument is a
folder path, for example a small Llama or Qwen2 checkpoint on a GPU box. Folders made
by this course carry ``course_tokenizer.json`` (byte tokenizer); others use their own
tokenizer through ``transformers`` when it is installed (none at all: prompts are token ids).

Supported (``LlamaConfig.from_hf_dict``): ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` in the
old (top-level ``rope_theta``/``rope_scaling``) and transformers 5 (``rope_parameters``) config
formats; rope types default, linear and llama3; Llama's ``attention_bias``/``mlp_bias``, Qwen2's
q/k/v biases; tied embeddings; an explicit ``head_dim``; every EOS id of ``config.json`` and
``generation_config.json``. Anything else that changes the maths (other rope types, sliding
windows, activations other than silu, quantized weights) raises ``ValueError`` naming the field,
and weights must match the config exactly: the loaded model gives transformers' logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from course_lib.models.llama import ARCHITECTURES, LlamaConfig, LlamaForCausalLM
from course_lib.models.tokenizer import ByteTokenizer

ASSETS = Path(__file__).resolve().parent / "assets"
MODEL_TYPES = {architecture: model_type for model_type, architecture in ARCHITECTURES.items()}


def save_pretrained(model: LlamaForCausalLM, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``config.json``, ``model.safetensors`` (in ``dtype``) and the byte-tokenizer marker."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2))
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "course_tokenizer.json").write_text(json.dumps({"type": "bytes"}))
    return folder


def resolve(name_or_path: str | Path) -> Path:
    """A shipped model's folder, or the given folder; the error lists the shipped names."""
    shipped = ASSETS / str(name_or_path)
    folder = shipped if shipped.is_dir() else Path(name_or_path)
    if not (folder / "config.json").is_file():
        names = sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file()) if ASSETS.is_dir() else []
        raise FileNotFoundError(
            f"No model {name_or_path!r}: pass one of the shipped models {names} or a folder with config.json "
            f"and *.safetensors (a Hugging Face Llama or Qwen2 checkpoint)."
        )
    return folder


def load_model(name_or_path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Return ``(model, tokenizer)``; the model is in eval mode on ``device`` in ``dtype``.
    The tokenizer is None for a folder without tokenizer files."""
    folder = resolve(name_or_path)
    data = json.loads((folder / "config.json").read_text())
    architecture = (data.get("architectures") or ["LlamaForCausalLM"])[0]
    if architecture not in MODEL_TYPES:
        raise ValueError(f"{folder}: architecture {architecture} is not supported; use one of {sorted(MODEL_TYPES)}.")
    generation = folder / "generation_config.json"
    generation_eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    try:
        config = LlamaConfig.from_hf_dict({**data, "model_type": MODEL_TYPES[architecture]}, generation_eos)
    except ValueError as error:
        raise ValueError(f"{folder}: {error}") from error
    model = LlamaForCausalLM(config)
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    unexpected = [k for k in unexpected if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]}).")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval(), _tokenizer(folder)


def _tokenizer(folder: Path):
    """The folder's tokenizer: ours, its own through transformers, or None (prompts as token ids)."""
    if (folder / "course_tokenizer.json").is_file():
        return ByteTokenizer()
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ImportError(f"{folder} needs its own tokenizer: pip install transformers") from error
    return AutoTokenizer.from_pretrained(str(folder))
