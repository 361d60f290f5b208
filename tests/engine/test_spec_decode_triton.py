"""Verification steps (several query tokens per decoding request) on the Triton backend."""

import copy
import os

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

pytest.importorskip("triton")


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs a GPU or Triton's interpreter")
def test_speculation_on_the_triton_backend_matches_the_torch_backend(tiny_model):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = copy.deepcopy(tiny_model).float().to(device)  # the backend follows the weights' device
    prompts = [[5, 6, 7, 5, 6, 7, 5], list(range(10, 28)), [30, 31]]
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(model, max_model_len=64, num_gpu_blocks=32, block_size=4, max_num_batched_tokens=12,
                  attention_backend=backend, dtype=torch.float32, device=device,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
        result = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        outputs[backend] = [r.outputs[0].token_ids for r in result]
        assert llm.spec_decode_stats.num_draft_tokens > 0
    assert outputs["triton"] == outputs["torch"]
