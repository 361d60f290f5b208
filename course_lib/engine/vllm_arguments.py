"""vLLM's arguments to ``LLM(...)``, ``LLM.generate(...)`` and ``SamplingParams(...)``, and what this
engine does with each: the one table that the front door's refusals, the README's table and its
test all read.

Invariants: every keyword a front door accepts by name has a row here whose status is "supported",
"different" or "course-only"; every other row ("ignored", "unsupported") is a name the front door
does not take by name and that arrives through ``check_arguments``. An unsupported name, or one
that nobody has, is refused with a ``ValueError`` naming it, never Python's bare ``TypeError``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch

STATUSES = ("supported", "different", "course-only", "ignored", "unsupported")
OWNERS = ("LLM", "generate", "chat", "SamplingParams")
_ANY = object()  # an "ignored" row whose value never matters


@dataclass(frozen=True)
class Argument:
    """One argument of ``owner``: its ``status`` (one of ``STATUSES``) and a few words on it: the
    difference from vLLM, why it changes nothing here, or what to do instead. An "ignored" row
    accepts only ``ignored_value`` (any value when it is ``_ANY``); another value is refused."""

    owner: str
    name: str
    status: str
    note: str = ""
    ignored_value: object = _ANY


def _rows(owner: str, status: str, *entries) -> list[Argument]:
    """Rows of one owner and status from names or ``(name, note)`` / ``(name, note, ignored_value)``."""
    made = []
    for entry in entries:
        name, *rest = (entry,) if isinstance(entry, str) else entry
        made.append(Argument(owner, name, status, *rest))
    return made


_DROP = "drop the argument"
_LORA = "LoRA adapters: serve the base model, or merge the adapter into its weights first"
ARGUMENTS: tuple[Argument, ...] = tuple([
    *_rows("LLM", "supported", "model", "max_num_seqs", "max_num_batched_tokens",
           "max_model_len", "block_size", "gpu_memory_utilization", "enable_prefix_caching",
           "long_prefill_token_threshold", "tensor_parallel_size", "speculative_config", "max_logprobs",
           ("seed", "starts the random stream of requests without a seed of their own (default 0, as V1)")),
    *_rows("LLM", "different",
           ("tokenizer", "a tokenizer object (encode/decode), used instead of the model's; vLLM's is a name or path"),
           ("dtype", '"auto" is float32 on a CPU and bfloat16 on CUDA, whatever the checkpoint says; '
                     "vLLM's takes the checkpoint's dtype (float32 checkpoints as float16). Any floating-point "
                     "torch dtype is taken too (float64 in tests)"),
           ("quantization", '"int8", "int4" or "w8a8" quantize full-precision weights at start-up; '
                            "vLLM's names (awq, gptq, fp8, ...) read checkpoints already quantized"),
           ("kv_cache_dtype", '"auto" or "fp8" (e4m3, scales calibrated at start-up); vLLM also has '
                              '"fp8_e5m2" and reads scales from the checkpoint'),
           ("scheduling_policy", '"fcfs" (or "continuous"), "priority", and "static" batching for comparison'),
           ("preemption_mode", 'V1 always recomputes; "swap" (V0\'s option) is kept for the lessons'),
           ("num_gpu_blocks", "vLLM's num_gpu_blocks_override")),
    *_rows("LLM", "course-only",
           ("num_cpu_blocks", "CPU blocks for swap preemption"),
           ("kv_offload_blocks", "a CPU tier for evicted prefix blocks, in blocks (vLLM sizes its "
                                 "offloading in GiB)"),
           ("device", '"cpu" or "cuda"; vLLM picks its platform itself'),
           ("attention_backend", '"torch", "cpu" or "triton"'),
           ("distributed_timeout_s", "bounds each tensor-parallel step")),
    *_rows("LLM", "ignored",
           ("enforce_eager", "this engine always runs eagerly (no CUDA graphs)"),
           ("trust_remote_code", "models load through this course's own code; no checkpoint code runs"),
           ("disable_log_stats", "this engine logs no statistics"),
           ("enable_chunked_prefill", "always on (chunked prefill falls out of the token budget); "
                                      "False is refused", True)),
    *_rows("LLM", "unsupported",
           ("enable_lora", _LORA),
           ("max_loras", "LoRA adapters: " + _DROP), ("max_lora_rank", "LoRA adapters: " + _DROP),
           ("pipeline_parallel_size", "use tensor_parallel_size"),
           ("data_parallel_size", "start one LLM per replica"),
           ("enable_expert_parallel", "the tiny model has no experts; " + _DROP),
           ("swap_space", "swap is sized in blocks here: num_cpu_blocks"),
           ("cpu_offload_gb", "weights stay on the device; " + _DROP),
           ("num_gpu_blocks_override", "use num_gpu_blocks"),
           ("kv_offloading_size", "use kv_offload_blocks (in blocks)"),
           ("tokenizer_mode", "the model brings its tokenizer; " + _DROP),
           ("skip_tokenizer_init", "pass token ids as prompts instead"),
           ("revision", "models are local folders here; " + _DROP), ("tokenizer_revision", _DROP),
           ("download_dir", "nothing is downloaded; pass a local folder as model"),
           ("load_format", "safetensors only; " + _DROP), ("hf_token", "nothing is downloaded; " + _DROP),
           ("hf_overrides", "edit the checkpoint's config.json"),
           ("task", "generation only; " + _DROP), ("runner", "generation only; " + _DROP),
           ("compilation_config", "no torch.compile here; " + _DROP),
           ("max_seq_len_to_capture", "no CUDA graphs here; " + _DROP),
           ("disable_custom_all_reduce", "tensor parallelism uses torch.distributed's all-reduce; " + _DROP),
           ("distributed_executor_backend", "ranks are forked processes; " + _DROP),
           ("enable_sleep_mode", _DROP), ("calculate_kv_scales", 'kv_cache_dtype="fp8" calibrates at start-up'),
           ("kv_transfer_config", "see course_lib/engine/disaggregated.py for prefill/decode disaggregation"),
           ("guided_decoding_backend", "no structured output here; " + _DROP),
           ("structured_outputs_config", "no structured output here; " + _DROP),
           ("limit_mm_per_prompt", "text only; " + _DROP), ("mm_processor_kwargs", "text only; " + _DROP),
           ("allowed_local_media_path", "text only; " + _DROP),
           ("generation_config", "pass defaults in SamplingParams"),
           ("override_generation_config", "pass defaults in SamplingParams"),
           ("enable_prompt_embeds", "prompts are text or token ids"),
           ("async_scheduling", "steps run one after another; " + _DROP),
           ("rope_scaling", "edit the checkpoint's config.json"), ("rope_theta", "edit the checkpoint's config.json")),
    *_rows("generate", "supported", "prompts", "sampling_params", "priority",
           ("use_tqdm", "True, False, or a callable used in tqdm's place")),
    *_rows("generate", "different", ("cache_salt", "vLLM reads it from the prompt dict; here it is an argument")),
    *_rows("generate", "course-only", ("on_step", "called with the step count after every step")),
    *_rows("generate", "unsupported",
           ("lora_request", _LORA),
           ("prompt_adapter_request", "prompt adapters: put the prefix into the prompt text"),
           ("guided_options_request", "no structured output here; check or retry the text after generating"),
           ("tokenization_kwargs", "prompts are tokenized whole; pass token ids to control tokenization")),
    *_rows("chat", "supported", ("messages", "one conversation or a list of them"), "sampling_params", "use_tqdm",
           "add_generation_prompt"),
    *_rows("chat", "unsupported",
           ("chat_template", "the tokenizer's own template is used; render the text yourself and call generate"),
           ("chat_template_kwargs", "render the text yourself and call generate"),
           ("chat_template_content_format", "contents are strings; " + _DROP),
           ("continue_final_message", "render the text yourself and call generate"),
           ("tools", "no tool calling here; " + _DROP),
           ("lora_request", _LORA),
           ("mm_processor_kwargs", "text only; " + _DROP)),
    *_rows("SamplingParams", "supported", "n", "temperature", "top_p", "top_k", "min_tokens", "stop",
           "stop_token_ids", "ignore_eos", ("max_tokens", "None: up to max_model_len, as vLLM"), "min_p", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "include_stop_str_in_output", "skip_special_tokens",
           ("logprobs", "from the raw logits, as vLLM's default"),
           ("seed", "per request; n samples use seed, seed + 1, ...; -1 or None: LLM(seed=...)'s stream")),
    *_rows("SamplingParams", "unsupported",
           ("best_of", "V1 dropped it too: use n and pick by cumulative_logprob (logprobs=0)"),
           ("spaces_between_special_tokens", _DROP), ("detokenize", "read token_ids; " + _DROP),
           ("logits_processors", "no per-request logits hooks here; " + _DROP),
           ("prompt_logprobs", "logprobs covers generated tokens only; score a prompt by generating from its prefixes"),
           ("allowed_token_ids", "no token masks here; filter the text after generating"),
           ("bad_words", "no token masks here; filter the text after generating"),
           ("logit_bias", "no token masks here; " + _DROP),
           ("truncate_prompt_tokens", "cut the prompt's token ids yourself (prompt_ids[-k:])"),
           ("guided_decoding", "no structured output here; check or retry the text after generating"),
           ("structured_outputs", "no structured output here; check or retry the text after generating"),
           ("output_kind", "generate returns finished outputs only; " + _DROP),
           ("extra_args", _DROP)),
])

VLLM_QUANTIZATION = ("awq", "awq_marlin", "gptq", "gptq_marlin", "gptq_bitblas", "bitblas", "marlin", "fp8",
                     "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp4", "compressed-tensors", "bitsandbytes",
                     "gguf", "hqq", "experts_int8", "moe_wna16", "torchao", "quark", "mxfp4", "auto-round",
                     "deepspeedfp", "tpu_int8", "ipex", "inc", "rtn")
DTYPES = {"auto": None, "float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "half": torch.float16}
CHAT_TEMPLATE_MISSING = ("As of transformers v4.44, default chat template is no longer allowed, so you must "
                         "provide a chat template if the tokenizer does not define one")  # vLLM's words
BEAM_SEARCH_REFUSAL = ("LLM.beam_search: vLLM has it, this course's engine does not. Sample several continuations "
                       "with SamplingParams(n=..., logprobs=0) and keep the one with the highest cumulative_logprob, "
                       "or use temperature=0 for the single most likely path.")


def rows(owner: str, *statuses: str) -> list[Argument]:
    """The table's rows for ``owner``, of the given statuses (all when none are given)."""
    return [a for a in ARGUMENTS if a.owner == owner and (not statuses or a.status in statuses)]


def check_arguments(owner: str, extra: dict) -> None:
    """Refuse every keyword in ``extra`` (those ``owner`` does not take by name) unless its row is
    "ignored" with a value that changes nothing: a ``ValueError`` naming it and what to do instead."""
    known = {a.name: a for a in rows(owner)}
    for name, value in extra.items():
        row = known.get(name)
        if row is not None and row.status == "ignored":
            if row.ignored_value is _ANY or value == row.ignored_value:
                continue
            raise ValueError(f"{owner}({name}={value!r}): this course's engine accepts only "
                             f"{name}={row.ignored_value!r} ({row.note}); drop the argument.")
        if row is not None and row.status == "unsupported":
            raise ValueError(f"{owner}({name}=...): vLLM has it, this course's engine does not; {row.note}.")
        raise ValueError(_unknown(owner, name))


def _unknown(owner: str, name: str) -> str:
    """The message for a name that neither this engine's ``owner`` nor vLLM's (as this table knows it) takes."""
    elsewhere = [a.owner for a in ARGUMENTS if a.name == name and a.owner != owner]
    if elsewhere:
        return f"{name} is an argument of {elsewhere[0]}, not of {owner}: pass it there."
    close = difflib.get_close_matches(name, [a.name for a in rows(owner)], n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return (f"{owner} has no argument {name!r}, here or in vLLM as far as this course's engine knows.{hint} "
            f"Its arguments are listed in the README's table of vLLM's arguments.")


def check_quantization(quantization: str | None) -> None:
    """Refuse vLLM's checkpoint quantization methods by name (this engine quantizes at start-up)."""
    if quantization in VLLM_QUANTIZATION:
        raise ValueError(f"quantization={quantization!r}: vLLM has it, this course's engine does not: it reads "
                         "no pre-quantized checkpoints. Use 'int8', 'int4' or 'w8a8', which quantize the "
                         "model's weights at start-up.")


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """``LLM(dtype=...)`` as a torch dtype: vLLM's strings, or any floating-point torch dtype (the
    tests use float64); "auto" is float32 on a CPU and bfloat16 on CUDA."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} is not a floating-point dtype; use one of {list(DTYPES)} or a "
                             "floating-point torch dtype.")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)} or a torch dtype, got {dtype!r}.")
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[dtype]


def markdown_table() -> str:
    """The README's table of vLLM's arguments, one row per ``ARGUMENTS`` entry."""
    lines = ["| where | argument | here | note |", "|---|---|---|---|"]
    lines += [f"| `{a.owner}` | `{a.name}` | {a.status} | {a.note} |" for a in ARGUMENTS]
    return "\n".join(lines)


if __name__ == "__main__":  # prints the README's table: python -m course_lib.engine.vllm_arguments
    print(markdown_table())
