"""The engine on its Triton attention backend gives the same greedy tokens as on PyTorch's."""

import copy
import os

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

pytest.importorskip("triton")


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs a GPU or Triton's interpreter")
def test_triton_backend_matches_torch_backend(tiny_model):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = copy.deepcopy(tiny_model).float().to(device)  # the backend follows the weights' device
    prompts = [[5, 6, 7, 8, 9], list(range(10, 28)), [30, 31]]  # a prefill in chunks, short ones, decodes
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(model, max_model_len=64, num_gpu_blocks=32, block_size=4, max_num_batched_tokens=8,
                  attention_backend=backend, dtype=torch.float32, device=device)
        result = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        outputs[backend] = [r.outputs[0].token_ids for r in result]
    assert outputs["triton"] == outputs["torch"]


def test_unknown_backend_is_refused(tiny_model):
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        LLM(tiny_model, max_model_len=64, num_gpu_blocks=32, attention_backend="cuda-graphs")
