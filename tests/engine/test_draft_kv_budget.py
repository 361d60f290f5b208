"""A draft model's KV lives in the engine's paged pool, inside the same budget as the target's, and
``LLM.kv_cache_bytes`` reports both shares (vLLM V1 registers the draft's attention layers as KV
layers sharing the target's block tables)."""

import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.llama import LlamaConfig
from tests.engine.test_spec_decode_equivalence import small_draft as draft_model  # KV unlike the target's

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def spec(k: int = 3) -> dict:
    return {"method": "draft_model", "model": draft_model(), "num_speculative_tokens": k}


def per_token(config: LlamaConfig, itemsize: int) -> int:
    """By hand: K and V, every layer, every KV head, the head's width."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * itemsize


def engine(model, **kwargs) -> LLM:
    settings = dict(max_model_len=64, max_num_seqs=8, block_size=4, dtype=torch.float64, speculative_config=spec())
    settings.update(kwargs)
    return LLM(model, **settings)


def tensor_bytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)


def test_the_draft_models_kv_is_paged_from_the_pool_and_reported(tiny_model):
    llm = engine(tiny_model, num_gpu_blocks=40)
    target, draft = per_token(tiny_model.config, 8), per_token(draft_model().config, 8)  # float64
    report = llm.kv_cache_bytes
    assert (report.num_blocks, report.block_size) == (40, 4)
    assert report.target_bytes == 40 * 4 * target == tensor_bytes(llm.runner.kv_caches)
    assert report.draft_bytes == 40 * 4 * draft == tensor_bytes(llm.proposer.kv_caches)  # not 8 rows x 64+ positions
    assert report.total_bytes == 40 * 4 * (target + draft) and report.block_bytes == 4 * (target + draft)
    every_tensor = [t for value in vars(llm.proposer).values() for t in (value if isinstance(value, list) else [value])
                    if isinstance(t, torch.Tensor)]
    assert tensor_bytes(every_tensor) == report.draft_bytes  # the proposer holds nothing outside the pool
    assert all(t.shape[1:3] == (40, 4) for t in llm.proposer.kv_caches)  # [2, blocks, block_size, heads, dim]
    plain = LLM(tiny_model, max_model_len=64, block_size=4, dtype=torch.float64, num_gpu_blocks=40)
    assert (plain.kv_cache_bytes.draft_bytes, plain.kv_cache_bytes.total_bytes) == (0, 40 * 4 * target)


def test_on_the_cpu_the_default_pool_holds_full_length_requests_with_their_draft_kv(tiny_model):
    llm = engine(tiny_model, max_num_seqs=3, max_model_len=30)
    blocks = -(-3 * 30 // 4)  # max_num_seqs full-length requests, both models' KV in the same blocks
    assert llm.cache_config.num_gpu_blocks == blocks
    assert llm.kv_cache_bytes.total_bytes == blocks * 4 * (per_token(tiny_model.config, 8)
                                                            + per_token(draft_model().config, 8))
    assert tensor_bytes(llm.runner.kv_caches) + tensor_bytes(llm.proposer.kv_caches) == llm.kv_cache_bytes.total_bytes


def test_on_cuda_the_budget_buys_blocks_that_hold_both_models_kv(tiny_model, monkeypatch):
    """``gpu_memory_utilization`` x memory, less what is allocated (both models' weights), less a 10%
    activation reserve, cut into blocks of target + draft bytes."""
    llm = engine(tiny_model, num_gpu_blocks=40)
    total, allocated = 10 * 2**20, 3 * 2**20

    class Properties:
        total_memory = total

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: allocated)
    target, draft = per_token(tiny_model.config, 8), per_token(draft_model().config, 8)
    budget = 0.9 * (0.5 * total - allocated)
    with_draft = llm._default_num_blocks("cuda", 0.5, 16, 8, 64, target, draft)
    assert with_draft == int(budget // (16 * (target + draft)))
    assert with_draft < llm._default_num_blocks("cuda", 0.5, 16, 8, 64, target, 0) == int(budget // (16 * target))


def test_draft_slots_come_from_the_pool_and_go_back_on_abort(tiny_model):
    """After a step the draft's lookahead (its drafts' KV) holds blocks of the request, as vLLM's
    lookahead slots do; aborting gives every block back and the proposer forgets the request."""
    llm = engine(tiny_model, num_gpu_blocks=40)
    llm.add_request([5, 6, 7, 8, 9, 10, 11], GREEDY, request_id="x")
    llm.step()  # prefill: 7 computed, 8 tokens; then 3 drafts written at positions 7..9
    request = llm.scheduler.running[0]
    assert len(request.spec_token_ids) == 3
    assert len(llm.kv_cache_manager.req_to_blocks["x"]) == -(-(7 + 3) // 4) == 3
    llm.abort_request("x")
    pool = llm.kv_cache_manager.block_pool
    assert pool.num_free_blocks == pool.num_blocks and not llm.proposer.num_valid


def test_a_full_pool_gets_fewer_drafts_and_the_same_text(tiny_model):
    """Two requests fill a 4-block pool after their prefill: each has room for the KV of one draft
    only (its last block's spare slot), so each gets one draft instead of three."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18]]
    llm = engine(tiny_model, num_gpu_blocks=4, max_model_len=16)
    for prompt in prompts:
        llm.add_request(prompt, GREEDY)
    llm.step()
    assert [len(r.spec_token_ids) for r in llm.scheduler.running] == [1, 1]
    assert llm.kv_cache_manager.block_pool.num_free_blocks == 0
    finished = {}
    while llm.scheduler.has_unfinished_requests():
        finished.update((r.request_id, r.output_token_ids) for r in llm.step())
    plain = LLM(tiny_model, max_model_len=16, block_size=4, dtype=torch.float64, num_gpu_blocks=4)
    assert [finished[str(i)] for i in range(2)] == [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY)]
    pool = llm.kv_cache_manager.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_preemption_gives_the_draft_models_blocks_back_and_keeps_the_text(tiny_model):
    prompts = [[3 + i, 9, 27, 4 + i, 11, 30 + i] for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm = engine(tiny_model, num_gpu_blocks=16, max_model_len=32, speculative_config=spec(4))
    outputs = llm.generate(prompts, params)
    assert llm.scheduler.total_preemptions > 0
    pool = llm.kv_cache_manager.block_pool
    assert pool.num_free_blocks == pool.num_blocks and not llm.proposer.num_valid
    plain = LLM(tiny_model, max_model_len=32, block_size=4, dtype=torch.float64, num_gpu_blocks=64)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids
                                                         for o in plain.generate(prompts, params)]


def test_the_readmes_draft_kv_figures_are_the_engines():
    from pathlib import Path

    llm = LLM("tiny-llama", max_model_len=512, attention_backend="torch", speculative_config={
        "method": "draft_model", "model": "tiny-llama-draft", "num_speculative_tokens": 4})
    report = llm.kv_cache_bytes
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    assert (f"{report.num_blocks:,} blocks of {report.block_size} tokens, {report.target_bytes / 2**20:.1f} MiB for "
            f"the target and {report.draft_bytes / 2**20:.1f} MiB for the draft model") in readme
