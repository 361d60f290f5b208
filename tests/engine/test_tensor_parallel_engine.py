"""``LLM(..., tensor_parallel_size=2)``: the same scheduler and paged KV cache over two real ranks.

Equality is exact on token ids in float32 on gloo: a rank's sum over its heads and the all-reduce
across ranks add the same products in a different order, so logits differ from TP=1 by up to
~1e-5 (7.6e-6 measured on the shipped model), far under the gaps between the shipped model's top logits on these prompts.
"""

import os

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives.launch import CollectiveTimeout, RankFailure, run_on_ranks
from course_lib.engine import tensor_parallel_runner
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM
from course_lib.models.loader import load_model
from course_lib.models.tensor_parallel_llama import check_tensor_parallel_size, shard_llama_

PROMPTS = ["The for statement", "def f(x):\n    return", "Lists are mutable", "An exception is raised when",
           "The with statement"]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def reference():
    return token_ids(LLM("tiny-llama", max_num_seqs=8).generate(PROMPTS, GREEDY))


@pytest.mark.parametrize("settings", [
    {},  # everything in one step each
    {"max_num_batched_tokens": 8, "max_num_seqs": 3},  # chunked prefill, requests interleaved
    {"num_gpu_blocks": 12, "block_size": 4, "max_model_len": 40, "max_num_seqs": 5},  # preemption by recompute
    {"num_gpu_blocks": 12, "block_size": 4, "max_model_len": 40, "preemption_mode": "swap"},  # KV swapped per rank
], ids=["plain", "chunked", "recompute", "swap"])
def test_greedy_tokens_equal_tensor_parallel_size_one(reference, settings):
    max_model_len = settings.get("max_model_len")
    params = GREEDY if max_model_len is None else SamplingParams(temperature=0, max_tokens=8)
    expected = reference if max_model_len is None else token_ids(
        LLM("tiny-llama", **{k: v for k, v in settings.items()}).generate(PROMPTS, params))
    with LLM("tiny-llama", tensor_parallel_size=2, **settings) as llm:
        assert token_ids(llm.generate(PROMPTS, params)) == expected
        if max_model_len is not None:  # the tight cache really preempted
            assert any(record.preempted for record in llm.step_trace)


def test_each_rank_holds_its_heads_and_kv_and_makes_two_all_reduces_per_layer():
    with LLM("tiny-llama", tensor_parallel_size=2, num_gpu_blocks=32, max_model_len=256) as llm:
        llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=3))
        c = llm.model.config
        assert llm.runner.all_reduces_per_step == 2 * c.num_hidden_layers
        for rank in llm.runner.ranks:
            assert rank["num_heads"] == c.num_attention_heads // 2
            assert rank["num_kv_heads"] == c.num_key_value_heads // 2
            assert rank["kv_cache_shape"] == (2, 32, 16, c.num_key_value_heads // 2, c.head_dim)


def sharded_logits():
    model, _ = load_model("tiny-llama", dtype=torch.float32, device="cpu")
    ids = torch.tensor([[256, *b"The for statement"]])
    with torch.no_grad():
        full = model.forward_dense(ids)
    comm = shard_llama_(model, dist.get_rank(), dist.get_world_size())
    with torch.no_grad():
        sharded = model.forward_dense(ids)
    return (sharded - full).abs().max().item(), len(comm.forward)


def test_sharded_logits_differ_from_the_full_model_only_by_rounding():
    differences = run_on_ranks(sharded_logits, 2, timeout_s=60)
    for difference, all_reduces in differences:
        assert 0 <= difference < 1e-4
        assert all_reduces == 12  # 6 layers x (attention + MLP)


def test_sizes_that_do_not_divide_the_heads_are_refused_before_any_rank_starts():
    model, _ = load_model("tiny-llama", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"6 attention heads.*tensor_parallel_size=4.*: 1, 2"):
        check_tensor_parallel_size(model.config, 4)
    with pytest.raises(ValueError, match=r"2 KV heads .*tensor_parallel_size=3"):
        LLM(model, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="speculative decoding with tensor_parallel_size=1 only"):
        LLM("tiny-llama", tensor_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 2})


ORIGINAL_FORWARD = tensor_parallel_runner._forward


def rank_one_skips_its_forward(worker, batch):
    if dist.get_rank() == 1:
        return None, 0
    return ORIGINAL_FORWARD(worker, batch)


def test_a_rank_that_skips_its_forward_times_out_instead_of_hanging(monkeypatch):
    llm = LLM("tiny-llama", tensor_parallel_size=2, distributed_timeout_s=3)
    monkeypatch.setattr(tensor_parallel_runner, "_forward", rank_one_skips_its_forward)
    with pytest.raises(CollectiveTimeout, match=r"rank 0: inside all_reduce"):
        llm.generate(PROMPTS[:1], GREEDY)
    with pytest.raises(RuntimeError, match="workers were stopped after a CollectiveTimeout.*create a new LLM"):
        llm.generate(PROMPTS[:1], GREEDY)


def test_a_rank_that_dies_is_reported():
    llm = LLM("tiny-llama", tensor_parallel_size=2)
    os.kill(llm.runner.pool._ranks.processes[1].pid, 9)
    with pytest.raises(RankFailure, match="rank 1 died with exit code -9"):
        llm.generate(PROMPTS[:1], GREEDY)


def test_after_close_new_work_is_refused_before_anything_is_queued_and_the_workers_are_gone():
    llm = LLM("tiny-llama", tensor_parallel_size=2)
    processes = llm.runner.pool._ranks.processes
    llm.close()
    assert all(not process.is_alive() for process in processes)
    with pytest.raises(RuntimeError, match="workers were stopped by close"):
        llm.generate(PROMPTS[:1], GREEDY)
    assert not llm.scheduler.has_unfinished_requests()


def test_a_notebook_interrupt_to_the_whole_process_group_does_not_kill_the_workers():
    import signal
    with LLM("tiny-llama", tensor_parallel_size=2, max_model_len=256) as llm:
        for process in llm.runner.pool._ranks.processes:  # what Jupyter's interrupt reaches besides the kernel
            os.kill(process.pid, signal.SIGINT)
        assert len(llm.generate(PROMPTS[:1], GREEDY)[0].outputs[0].token_ids) == GREEDY.max_tokens


def test_a_gqa_model_object_sampled_with_seeds_and_shared_prefixes_matches_one_rank():
    """8 query heads over 2 KV heads: each rank's 4 query heads must read its own KV head. Prompts
    sharing whole blocks (prefix-cache hits across requests), n=2 seeded sampling at T=0.8."""
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    shared = list(range(2, 40))  # over two 16-token blocks
    prompts = [shared + [40 + i] for i in range(3)]
    params = SamplingParams(temperature=0.8, max_tokens=12, n=2, seed=3, ignore_eos=True)
    expected = LLM(model, max_model_len=128).generate(prompts, params)
    with LLM(model, tensor_parallel_size=2, max_model_len=128) as llm:
        got = llm.generate(prompts, params)
        assert sum(record.prefix_hit_tokens for record in llm.step_trace) > 0
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in expected]
