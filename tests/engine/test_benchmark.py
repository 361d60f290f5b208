"""The serving benchmark's transformers continuous-batching column: same tokens as the engine."""

import pytest
import torch

from course_lib.engine.benchmark import Workload, make_workload, run_engine, run_transformers_continuous
from course_lib.models.loader import load_model, save_pretrained


def test_transformers_continuous_batching_matches_the_engine_with_per_request_lengths(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, _ = load_model("tiny-llama", dtype=torch.float32)
    save_pretrained(model, tmp_path, dtype=torch.float32)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                             attn_implementation="sdpa").eval()
    full = make_workload(5, seed=3)
    workload = Workload([p[:40] for p in full.prompts], [1, 7, 12, 3, 9])  # lengths differ per request

    theirs, seconds = run_transformers_continuous(hf_model, workload, max_num_seqs=2)  # 2 at a time: requests join
    ours, _, _ = run_engine(model, workload, "continuous", max_num_seqs=2)

    assert seconds > 0
    assert [len(tokens) for tokens in theirs] == workload.output_lens
    assert theirs == ours
