"""Numbers that lessons 07 and 09 state in prose agree with what course_lib computes: NVLink against one
InfiniBand NIC like for like, the tiny model's parameter count, and quantized weights as checkpoints ship."""

from __future__ import annotations

import json

import pytest

from course_lib.paths import REPO_ROOT
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, get_link
from course_lib.perf.models import get_model
from course_lib.perf.quant_cost import weight_memory

NUMBER_WORDS = {8: "eight", 9: "nine", 10: "ten", 18: "eighteen"}


def prose(lesson: str) -> str:
    book = json.loads((REPO_ROOT / "notebooks" / f"{lesson}.ipynb").read_text(encoding="utf-8"))
    return "\n".join("".join(cell["source"]) for cell in book["cells"] if cell["cell_type"] == "markdown")


def test_lesson_07_compares_nvlink_with_a_nic_like_for_like():
    ratio = round(get_link(NVLINK_4).bandwidth / get_link(INFINIBAND_NDR).bandwidth)  # each way against each way
    text = prose("07_nccl_topology")
    assert f"about {NUMBER_WORDS[ratio]} times slower than NVLink" in text
    assert "9 to 18" not in text and f"{NUMBER_WORDS[2 * ratio]} times" not in text


def test_lesson_09_states_the_tiny_models_parameter_count():
    import torch

    from course_lib.models.loader import load_model

    model, _ = load_model("tiny-llama", dtype=torch.float32, device="cpu")
    count = sum(p.numel() for p in model.parameters())
    text = prose("09_serving_tradeoffs")
    assert f"A model of {count / 1e6:.2f} M parameters" in text and "three-million" not in text


def test_lesson_09_prints_w4a16_weights_as_checkpoints_ship_them():
    book = json.loads((REPO_ROOT / "notebooks" / "09_serving_tradeoffs.ipynb").read_text(encoding="utf-8"))
    printed = "".join(text for cell in book["cells"] if cell["cell_type"] == "code"
                      for output in cell.get("outputs", []) for text in output.get("text", []))
    l70 = get_model("Llama-3.1-70B")
    modelled, shipped = weight_memory(l70, "W4A16") / 1e9, weight_memory(l70, "W4A16", quantized_embeddings=False) / 1e9
    assert shipped == pytest.approx(39.5, abs=0.05) and modelled == pytest.approx(36.4, abs=0.05)
    assert f"{modelled:6.1f} GB of weights ({shipped:5.1f} GB with 16-bit embeddings)" in printed
