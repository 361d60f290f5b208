import pytest

from course_lib.perf.hardware import get_gpu
from course_lib.perf.kv import (
    KVCacheMemoryError,
    MaxModelLenError,
    kv_bytes_per_batch,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    model_kv_bytes_per_token,
    plan_kv_cache,
    tensor_parallel_to_start,
    utilization_to_start,
    weight_bytes,
)
from course_lib.perf.models import DEEPSEEK_V3, ModelSpec, attention_variants, get_model
from course_lib.perf.units import GiB, KiB, MiB, format_bytes


@pytest.mark.parametrize(
    "model, dtype, expected",
    [
        ("Llama-3-8B", "fp16", 131072),  # 2*32*8*128*2
        ("Llama-3.1-70B", "bf16", 327680),  # 2*80*8*128*2
        ("Qwen2.5-7B", "bf16", 57344),  # 2*28*4*128*2
        ("Mistral-7B-v0.3", "fp16", 131072),
        ("Llama-2-7B", "fp16", 524288),  # MHA: 2*32*32*128*2
        ("Falcon-7B", "bf16", 8192),  # MQA: 2*32*1*64*2
        ("Llama-3-8B", "fp8", 65536),
        ("DeepSeek-V3", "bf16", 70272),  # MLA: 61*(512+64)*2, one latent per token and layer
        ("DeepSeek-V3", "fp8", 35136),
    ],
)
def test_kv_bytes_per_token_matches_the_formula(model, dtype, expected):
    spec = DEEPSEEK_V3 if model == DEEPSEEK_V3.name else get_model(model)
    assert model_kv_bytes_per_token(spec, dtype) == expected


def test_llama3_8b_sequence_and_batch_sizes():
    model = get_model("Llama-3-8B")
    assert kv_bytes_per_sequence(model, 2048) == 256 * MiB
    assert kv_bytes_per_batch(model, 2048, 8) == 2 * GiB


def test_mha_gqa_mqa_scale_with_kv_heads():
    sizes = [model_kv_bytes_per_token(m) for m in attention_variants(get_model("Llama-3-8B"))]
    assert sizes == [512 * KiB, 128 * KiB, 16 * KiB]
    assert [m.attention_kind for m in attention_variants(get_model("Llama-3-8B"))] == ["MHA", "GQA", "MQA"]


def test_tensor_parallelism_splits_weights_and_kv_heads():
    model = get_model("Llama-3.1-70B")
    assert weight_bytes(model, "bf16", 4) == pytest.approx(70.6e9 * 2 / 4)
    assert model_kv_bytes_per_token(model, "bf16", 4) == 327680 / 4
    # More GPUs than KV heads: heads are replicated, never fewer than one per GPU.
    assert model_kv_bytes_per_token(model, "bf16", 16) == 327680 / 8
    # MLA's latent is shared by all heads: TP cannot split it, every rank holds it whole.
    deepseek = DEEPSEEK_V3
    assert model_kv_bytes_per_token(deepseek, "bf16", 8) == model_kv_bytes_per_token(deepseek, "bf16") == 70272


@pytest.mark.parametrize("args", [(0, 8, 128, 2), (32, -1, 128, 2), (32, 8, 0, 2), (32, 8, 128, 0)])
def test_non_positive_sizes_are_rejected(args):
    with pytest.raises(ValueError, match="must be a positive number"):
        kv_bytes_per_token(*args)


def test_bad_model_spec_and_unknown_names_explain_the_fix():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelSpec("odd", 2, 6, 4, 64, 1e6, 128, hidden_size=384, intermediate_size=1024, vocab_size=256)
    with pytest.raises(KeyError, match="choose one of"):
        get_model("GPT-9")
    with pytest.raises(KeyError, match="choose one of"):
        get_gpu("TPU")


def test_plan_default_settings_on_h100():
    plan = plan_kv_cache(get_model("Llama-3.1-8B"), get_gpu("H100-80GB"))
    expected_kv = 0.9 * 80 * GiB - 8.03e9 * 2 - 1 * GiB
    assert plan.kv_cache_bytes == pytest.approx(expected_kv)
    assert plan.num_blocks == int(expected_kv // (16 * 128 * KiB))
    assert plan.max_tokens == plan.num_blocks * 16
    assert plan.max_concurrency == pytest.approx(plan.max_tokens / 131072)
    assert plan.max_concurrency > 3


def test_startup_bug_on_a_40gb_gpu_leaves_no_cache_blocks():
    with pytest.raises(KVCacheMemoryError) as error:
        plan_kv_cache(get_model("Llama-3.1-8B"), get_gpu("A100-40GB"), gpu_memory_utilization=0.30,
                      max_model_len=131072)
    message = str(error.value)
    assert "No available memory for the cache blocks" in message
    assert "12.0 GiB" in message and "15.0 GiB" in message  # budget below the weights
    assert "4.0 GiB more than it may use" in message and "leaving -" not in message
    assert "raise gpu_memory_utilization to 0.80 or more (0.9, the default, is enough)" in message
    assert "use tensor_parallel_size=4" in message  # at 0.30, two GPUs are not enough


def test_startup_bug_on_an_80gb_gpu_fits_fewer_tokens_than_one_request():
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    with pytest.raises(KVCacheMemoryError) as error:
        plan_kv_cache(model, gpu, gpu_memory_utilization=0.30, max_model_len=131072)
    message = str(error.value)
    assert "16.0 GiB" in message  # 131072 tokens x 128 KiB
    for fix in ("raise gpu_memory_utilization to 0.40 or more", "lower max_model_len", "max_num_seqs",
                "use tensor_parallel_size=2 (each GPU then holds 7.5 GiB of weights and 4 KV heads of 8)"):
        assert fix in message
    # The limit the message suggests really does start.
    suggested = int(message.split("lower max_model_len to ")[1].split(" ")[0])
    plan = plan_kv_cache(model, gpu, gpu_memory_utilization=0.30, max_model_len=suggested)
    assert plan.max_tokens == suggested
    with pytest.raises(KVCacheMemoryError):
        plan_kv_cache(model, gpu, gpu_memory_utilization=0.30, max_model_len=suggested + 1)


def test_each_fix_from_the_message_lets_the_server_start():
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("H100-80GB")
    assert plan_kv_cache(model, gpu, gpu_memory_utilization=0.9, max_model_len=131072).num_blocks > 8192
    assert plan_kv_cache(model, gpu, gpu_memory_utilization=0.30, max_model_len=32768).max_concurrency > 1
    assert plan_kv_cache(model, gpu, gpu_memory_utilization=0.30, max_model_len=131072,
                         tensor_parallel_size=2).max_concurrency >= 1


@pytest.mark.parametrize("bad", [{"gpu_memory_utilization": 0}, {"gpu_memory_utilization": 1.2},
                                 {"block_size": 0}, {"max_model_len": -5}, {"activation_reserve_bytes": -1}])
def test_plan_rejects_bad_settings(bad):
    with pytest.raises(ValueError):
        plan_kv_cache(get_model("Llama-3-8B"), get_gpu("H100-80GB"), **bad)


def test_format_bytes_picks_binary_units():
    assert format_bytes(131072) == "128.0 KiB"
    assert format_bytes(16 * GiB) == "16.0 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(-2 * MiB) == "-2.0 MiB"


@pytest.mark.parametrize("device_name, preset", [
    ("NVIDIA H200", "H200-141GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("Tesla T4", None),
])
def test_cuda_device_names_map_to_presets(device_name, preset):
    from course_lib.perf.hardware import match_gpu

    found = match_gpu(device_name)
    assert (found.name if found else None) == preset
    if found:
        assert found.hbm_bandwidth > 1e11


@pytest.mark.parametrize("preset, kv_heads", [("Llama-3.1-70B", [64, 8, 1]), ("Qwen2.5-7B", [28, 4, 1]),
                                              ("Llama-2-7B", [32, 8, 1]), ("Falcon-7B", [71, 1])])
def test_attention_variants_follow_the_models_own_query_heads(preset, kv_heads):
    variants = attention_variants(get_model(preset))
    assert [v.num_kv_heads for v in variants] == kv_heads
    assert all(v.num_heads % v.num_kv_heads == 0 for v in variants)


FAILING_STARTS = [
    ("Llama-3.1-8B", "A100-40GB", dict(gpu_memory_utilization=0.30, max_model_len=131072)),
    ("Llama-3.1-8B", "H100-80GB", dict(gpu_memory_utilization=0.30, max_model_len=131072)),
    ("Llama-3.1-70B", "H100-80GB", dict(gpu_memory_utilization=0.98, max_model_len=131072)),
    ("Llama-3.1-70B", "H100-80GB", dict(gpu_memory_utilization=0.9, max_model_len=131072, tensor_parallel_size=2)),
    ("Mixtral-8x7B", "L4-24GB", dict(gpu_memory_utilization=0.9, max_model_len=32768)),
    ("DeepSeek-V3", "H200-141GB", dict(gpu_memory_utilization=0.9, tensor_parallel_size=2)),
]


@pytest.mark.parametrize("model, gpu, settings", FAILING_STARTS, ids=lambda v: str(v))
def test_every_fix_the_error_computes_starts_the_server_and_none_is_offered_that_cannot(model, gpu, settings):
    spec = DEEPSEEK_V3 if model == DEEPSEEK_V3.name else get_model(model)
    with pytest.raises(KVCacheMemoryError) as error:
        plan_kv_cache(spec, get_gpu(gpu), **settings)
    message = str(error.value)
    assert " -" not in message  # sizes are never negative: a shortfall is said as one
    utilization = utilization_to_start(spec, get_gpu(gpu), **settings)
    if utilization is None:
        assert "raise gpu_memory_utilization" not in message and "Not even gpu_memory_utilization=1.0" in message
        with pytest.raises(KVCacheMemoryError):
            plan_kv_cache(spec, get_gpu(gpu), **{**settings, "gpu_memory_utilization": 1.0})
    else:
        assert f"raise gpu_memory_utilization to {utilization:.2f} or more" in message
        plan_kv_cache(spec, get_gpu(gpu), **{**settings, "gpu_memory_utilization": utilization})
        with pytest.raises(KVCacheMemoryError):  # the least that starts it
            plan_kv_cache(spec, get_gpu(gpu), **{**settings, "gpu_memory_utilization": round(utilization - 0.01, 2)})
    if "use tensor_parallel_size=" in message:
        size = int(message.split("use tensor_parallel_size=")[1].split(" ")[0])
        assert spec.num_heads % size == 0
        plan_kv_cache(spec, get_gpu(gpu), **{**settings, "tensor_parallel_size": size})
    else:
        assert tensor_parallel_to_start(spec, get_gpu(gpu), **settings) is None


def test_a_max_model_len_beyond_the_models_context_is_refused_as_vllm_does():
    falcon = get_model("Falcon-7B")
    with pytest.raises(MaxModelLenError, match="set max_model_len to 2048 or less"):
        plan_kv_cache(falcon, get_gpu("H100-80GB"), max_model_len=2049)
    assert plan_kv_cache(falcon, get_gpu("H100-80GB"), max_model_len=2048).max_model_len == 2048
    assert plan_kv_cache(falcon, get_gpu("H100-80GB")).max_model_len == 2048  # unset: the model's own


def test_tensor_parallelism_is_only_offered_where_it_divides_the_heads():
    falcon = get_model("Falcon-7B")  # 71 attention heads: vLLM refuses TP 2, 4 and 8
    assert tensor_parallel_to_start(falcon, get_gpu("L4-24GB"), gpu_memory_utilization=0.3) is None
    with pytest.raises(KVCacheMemoryError) as error:
        plan_kv_cache(falcon, get_gpu("L4-24GB"), gpu_memory_utilization=0.3)
    assert "tensor_parallel_size=" not in str(error.value).split("Fixes:")[1]
