"""``LLM``: the engine's front door, with vLLM's constructor arguments and ``generate``.

One ``step()`` = schedule, run the model once on the flat batch, append sampled tokens,
retire finished requests. ``generate`` adds every prompt, then steps until all finish.
Every step is recorded in ``step_trace`` for the lessons to draw.

As in vLLM: ``generate(prompts, sampling_params)`` takes one ``SamplingParams`` or a list with one
per prompt (stop strings, stop token ids, ``min_tokens``, ``logprobs``: ``sampling_params.py``), and
``priority=[...]`` under ``scheduling_policy="priority"`` (lower first; ``scheduler.py``); a request
stops on any of the model's EOS ids (``config.eos_token_ids``). Requests without a ``seed`` of their own
draw from one random stream seeded by ``LLM(seed=...)`` (vLLM V1's default 0), so two engines built with
the same seed sample alike when given the same calls. ``reset_prefix_cache()`` empties the
prefix cache between runs, and ``get_metrics()`` reports vLLM's counters and gauges
(``engine_metrics.py``).

Bad input is refused before anything is queued (``ValueError`` naming the field): prompt ids and
``stop_token_ids`` outside the vocabulary, a request id already in flight. A step that fails aborts
its requests (blocks freed) and raises; ``generate`` left by an exception (Ctrl-C, ``on_step``)
aborts what it queued; ``abort_request(ids)`` is vLLM's, for ``add_request``/``step`` users.

With ``speculative_config`` (vLLM's keys), a proposer drafts up to k tokens for every decoding
request after each step; the next step verifies them in the same target pass as everything
else. ``spec_decode_stats`` sums the acceptance counts of all finished requests; each
request's own are on its ``RequestOutput.metrics[i].spec_decode_stats``. A draft model's KV is
paged in the same pool (its layers share the target's block tables, as in vLLM V1), so it comes out
of the same budget: ``_default_num_blocks`` sizes blocks that hold both models' KV, after both
models' weights are loaded. ``kv_cache_bytes`` (``engine/kv_budget.py``) reports the number of
blocks and the target's and the draft's bytes.

With ``tensor_parallel_size=N`` (vLLM's name), the model runs sharded over N rank workers (gloo on
CPUs; NCCL with one GPU per rank when ``device`` is CUDA) under this process's scheduler and KV
cache manager (``engine/tensor_parallel_runner.py``); ``distributed_timeout_s`` bounds every step.
``close()`` (or ``with LLM(...) as llm:``) stops the workers.

With ``quantization`` ("int8", "int4" or "w8a8", ``course_lib/quant``), every linear layer of the
decoder is replaced by its quantized form before serving (a model object passed in is copied
first); ``quantization_summary`` says what was replaced and the bytes saved. "int4" is group-wise
with groups of 128, the last group of a row shorter where the width does not divide by 128.

With ``kv_cache_dtype="fp8"`` (vLLM's option; default "auto" = the model's dtype) the paged KV
cache holds float8 e4m3: one byte per element, so the same memory holds 2x the blocks of bf16 (4x
of float32), which ``_default_num_blocks`` counts. Each layer's ``k_scale`` / ``v_scale`` are
calibrated once at start-up (``course_lib/quant/kv_fp8.py``: amax over a few training-corpus windows,
/ 200 for K and / 100 for V) and kept on the model's attention layers (``kv_scales``; a model object
passed in is copied first). Both attention backends read and write it (the Triton one decodes
the e4m3 bytes in registers), at ``tensor_parallel_size=1``, with or without ``quantization``.

With ``kv_offload_blocks=N`` (a KV offload tier of N CPU blocks, ``engine/kv_offload.py``), prefix-cache
blocks evicted from the GPU pool are copied to CPU memory (LRU there) and a later prefix hit on
them is reloaded instead of recomputed. ``kv_cache_manager.prefix_cache_stats`` counts hits by tier
(``gpu_hit_tokens``, ``cpu_hit_tokens``); each ``StepRecord`` has the step's block copies.
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
from dataclasses import replace
from numbers import Integral
from typing import Callable

import torch

from course_lib.engine.backend import check_triton_possible, resolve_attention_backend
from course_lib.engine.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from course_lib.engine.kv_budget import KVCacheBytes, blocks_for_budget, token_bytes
from course_lib.engine.kv_cache_manager import KVCacheManager
from course_lib.engine.engine_metrics import Metric, engine_metrics
from course_lib.engine.metrics import SpecDecodeStats, StepRecord
from course_lib.engine.model_runner import ATTENTION_BACKENDS, ModelRunner, prepare
from course_lib.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from course_lib.engine.progress import ProgressBar
from course_lib.engine.proposers import DraftModelProposer, NgramProposer
from course_lib.engine.request import Request, RequestStatus
from course_lib.engine.sampling_params import SamplingParams
from course_lib.engine.scheduler import Scheduler
from course_lib.engine.tensor_parallel_runner import TensorParallelRunner
from course_lib.engine.vllm_arguments import (BEAM_SEARCH_REFUSAL, CHAT_TEMPLATE_MISSING, check_arguments,
                                              check_quantization, resolve_dtype)
from course_lib.kv_cache.fp8 import FP8_DTYPE, kv_cache_torch_dtype
from course_lib.models.corpus import corpus
from course_lib.models.llama import LlamaForCausalLM
from course_lib.models.loader import load_model
from course_lib.models.tensor_parallel_llama import check_tensor_parallel_size
from course_lib.models.tokenizer import ByteTokenizer
from course_lib.quant.kv_fp8 import calibrate_kv_scales, set_kv_scales_
from course_lib.quant.linear import quantize_model_

QUANTIZATION_OPTIONS = {"int4": {"group_size": 128, "pad_k": True}}  # per scheme: quantize_model_'s options


def _one_per_prompt(value, count: int, name: str) -> list:
    """``value`` repeated for ``count`` prompts, or the list given, which must have one per prompt."""
    if not isinstance(value, (list, tuple)):
        return [value] * count
    if len(value) != count:
        raise ValueError(f"{name} has {len(value)} entries for {count} prompts: give one per prompt, or a "
                         "single value for all.")
    return list(value)


def _prompt_of(prompt):
    """A prompt in any form vLLM's ``generate`` takes, as text or token ids: a string, a list of ids,
    ``{"prompt": text}`` (vLLM's TextPrompt) or ``{"prompt_token_ids": [...]}`` (its TokensPrompt)."""
    if not isinstance(prompt, dict):
        return prompt
    unsupported = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
    if unsupported:
        raise ValueError(f"This engine takes a prompt dict with 'prompt' or 'prompt_token_ids' only; "
                         f"{', '.join(map(repr, unsupported))} is not supported.")
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError("A prompt dict needs 'prompt' (text) or 'prompt_token_ids' (a list of token ids).")


def _check_tensor_parallel_devices(model: LlamaForCausalLM, device: str, tensor_parallel_size: int) -> None:
    """Forked ranks need the model on the CPU, and, for CUDA, a GPU each and CUDA untouched here."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("With tensor_parallel_size > 1 pass the model on the CPU (or by name): each rank moves "
                         "its own shard to its own device.")
    if device.startswith("cuda"):
        if torch.cuda.device_count() < tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} needs a GPU per rank; this machine has "
                             f"{torch.cuda.device_count()}. Lower it, or pass device='cpu' to run the ranks on gloo.")
        if torch.cuda.is_initialized():
            raise RuntimeError("This process has already used CUDA, so forked rank workers cannot: create the "
                               "tensor-parallel LLM first (restart the kernel), or pass device='cpu'.")


class LLM:
    def __init__(
        self,
        model: str | LlamaForCausalLM = "tiny-llama",
        *,
        tokenizer=None,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 512,
        max_model_len: int | None = None,
        block_size: int = 16,
        num_gpu_blocks: int | None = None,
        gpu_memory_utilization: float = 0.9,
        enable_prefix_caching: bool = True,
        long_prefill_token_threshold: int = 0,
        preemption_mode: str = "recompute",
        scheduling_policy: str = "continuous",
        num_cpu_blocks: int | None = None,
        device: str | None = None,
        dtype: str | torch.dtype = "auto",
        attention_backend: str | None = None,
        speculative_config: dict | SpeculativeConfig | None = None,
        tensor_parallel_size: int = 1,
        distributed_timeout_s: float = 60.0,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        kv_offload_blocks: int | None = None,
        max_logprobs: int = 20,
        seed: int = 0,
        **vllm_arguments,
    ) -> None:
        check_arguments("LLM", vllm_arguments)  # vLLM's names this engine lacks, refused by name
        check_quantization(quantization)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = resolve_dtype(dtype, device)
        self.tensor_parallel_size = tensor_parallel_size
        if tensor_parallel_size != 1 and speculative_config is not None:
            raise ValueError("This engine runs speculative decoding with tensor_parallel_size=1 only; drop "
                             "speculative_config or tensor_parallel_size.")
        # With tensor parallelism the ranks load their shards to their own devices; this process keeps
        # the full model on the CPU (touching CUDA here would stop forked ranks from using it).
        load_device = device if tensor_parallel_size == 1 else "cpu"
        if quantization is not None and tensor_parallel_size != 1:
            raise ValueError("This engine quantizes with tensor_parallel_size=1 only; drop quantization or "
                             "tensor_parallel_size.")
        fp8_cache = kv_cache_torch_dtype(kv_cache_dtype, dtype) == FP8_DTYPE  # refuses a bad value before any work
        if fp8_cache and tensor_parallel_size != 1:
            raise ValueError('This engine runs kv_cache_dtype="fp8" with tensor_parallel_size=1 only; drop '
                             "kv_cache_dtype or tensor_parallel_size.")
        if isinstance(model, str):
            model, own_tokenizer = load_model(model, dtype=dtype, device=load_device)
            tokenizer = tokenizer or own_tokenizer  # a tokenizer passed in wins over the folder's
        elif quantization is not None or fp8_cache:
            model = copy.deepcopy(model)  # the caller's model stays as it was
        self.quantization_summary = None if quantization is None else quantize_model_(
            model, quantization, **QUANTIZATION_OPTIONS.get(quantization, {}))
        self.kv_cache_dtype = kv_cache_dtype
        kv_dtype = kv_cache_torch_dtype(kv_cache_dtype, next(model.parameters()).dtype)  # "auto": the model's own
        if fp8_cache:  # on this engine's own copy: a caller's model (perhaps serving another engine) is untouched
            set_kv_scales_(model, calibrate_kv_scales(model, corpus()[0]))
        self.kv_scales = [layer.self_attn.kv_scales for layer in model.model.layers] if fp8_cache else None
        if tensor_parallel_size != 1:
            check_tensor_parallel_size(model.config, tensor_parallel_size)
            _check_tensor_parallel_devices(model, device, tensor_parallel_size)
        self.model, self.tokenizer = model, tokenizer or ByteTokenizer()  # bytes when the model brings none
        limit = model.config.max_position_embeddings
        max_model_len = max_model_len or limit
        if max_model_len > limit:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's {limit} positions; lower it.")
        self.speculative_config = None if speculative_config is None else SpeculativeConfig.from_dict(speculative_config)
        draft = self._load_draft(self.speculative_config, dtype, device)  # its weights are in place before sizing
        per_token = (token_bytes(model.config, kv_dtype),  # the draft's KV shares the pool, in the draft's dtype
                     0 if draft is None else token_bytes(draft.config, next(draft.parameters()).dtype))
        if num_gpu_blocks is None:
            num_gpu_blocks = self._default_num_blocks(load_device, gpu_memory_utilization, block_size,
                                                      max_num_seqs, max_model_len, *per_token)
        self.kv_cache_bytes = KVCacheBytes(num_gpu_blocks, block_size, *per_token)
        if num_gpu_blocks * block_size < max_model_len:
            raise ValueError(
                f"A KV cache of {num_gpu_blocks} blocks x {block_size} tokens cannot hold one request of "
                f"max_model_len={max_model_len} tokens; raise num_gpu_blocks to at least "
                f"{-(-max_model_len // block_size)} or lower max_model_len."
            )
        self.scheduler_config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len,
                                                long_prefill_token_threshold, preemption_mode, scheduling_policy)
        self.cache_config = CacheConfig(block_size, num_gpu_blocks, enable_prefix_caching)
        num_cpu_blocks = num_gpu_blocks if num_cpu_blocks is None and preemption_mode == "swap" else (num_cpu_blocks or 0)
        if kv_offload_blocks is not None and kv_offload_blocks < 0:
            raise ValueError(f"kv_offload_blocks must be 0 or more CPU blocks, got {kv_offload_blocks}.")
        kv_offload_blocks = kv_offload_blocks or 0
        self.kv_cache_manager = KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching, kv_offload_blocks)
        self.scheduler = Scheduler(self.scheduler_config, self.kv_cache_manager, num_cpu_blocks)
        # Triton kernels where they compile and pass a probe step, else PyTorch (see engine/backend.py).
        if tensor_parallel_size == 1:
            self.attention_backend = resolve_attention_backend(attention_backend, model, block_size, kv_dtype)
            self.runner = ModelRunner(model, num_gpu_blocks, block_size, num_cpu_blocks, self.attention_backend,
                                      kv_offload_blocks, kv_cache_dtype=kv_dtype)
        else:  # each rank resolves the backend on its own device; a setting that cannot work fails here
            if attention_backend not in (None, *ATTENTION_BACKENDS):
                raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {attention_backend!r}.")
            if attention_backend == "triton":
                check_triton_possible(torch.device(device))
            self.runner = TensorParallelRunner(model, tensor_parallel_size, num_gpu_blocks, block_size, num_cpu_blocks,
                                               attention_backend, next(model.parameters()).dtype,  # as at TP=1
                                               backend="nccl" if device.startswith("cuda") else "gloo",
                                               timeout_s=distributed_timeout_s, num_offload_blocks=kv_offload_blocks)
            self.attention_backend = self.runner.attention_backend
        self.proposer = self._make_proposer(self.speculative_config, draft, num_gpu_blocks)
        self.spec_decode_stats = (SpecDecodeStats(self.speculative_config.num_speculative_tokens)
                                  if self.speculative_config else None)
        self.max_logprobs = model.config.vocab_size if max_logprobs == -1 else max_logprobs
        self.step_trace: list[StepRecord] = []
        if isinstance(seed, bool) or not isinstance(seed, Integral):
            raise ValueError(f"seed must be an integer (vLLM V1's default is 0), got {seed!r}.")
        self._engine_generator = torch.Generator().manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}  # per request id: its own, or the engine's
        self._ids = itertools.count()
        self._siblings: dict[str, list[str]] = {}  # the ids of a request's n > 1 samples, while in flight

    def _default_num_blocks(self, device: str, utilization: float, block_size: int, max_num_seqs: int,
                            max_model_len: int, target_token_bytes: int, draft_token_bytes: int) -> int:
        """On CUDA, what ``gpu_memory_utilization`` leaves after the weights (the target's and a draft
        model's; less a 10% activation reserve), in blocks that hold both models' KV (``kv_budget.py``);
        on the CPU, and with tensor parallelism, enough for ``max_num_seqs`` full-length requests, which
        covers a draft model's KV too (it lives in the same blocks)."""
        if not device.startswith("cuda"):
            return -(-max_num_seqs * max_model_len // block_size)
        total = torch.cuda.get_device_properties(device).total_memory
        budget = utilization * total - torch.cuda.memory_allocated(device)
        return blocks_for_budget(0.9 * budget, block_size, target_token_bytes, draft_token_bytes)

    def _load_draft(self, spec: SpeculativeConfig | None, dtype: torch.dtype, device: str) -> LlamaForCausalLM | None:
        """The draft model of ``method="draft_model"`` on the engine's device and dtype (None otherwise)."""
        if spec is None or spec.method != "draft_model":
            return None
        draft = spec.model
        if isinstance(draft, LlamaForCausalLM):
            draft = draft.to(device=device, dtype=dtype).eval()
        else:
            draft, _ = load_model(draft, dtype=dtype, device=device)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"The draft model's vocabulary ({draft.config.vocab_size} tokens) differs from the "
                             f"target's ({self.model.config.vocab_size}); use a draft trained with the same tokenizer.")
        return draft

    def _make_proposer(self, spec: SpeculativeConfig | None, draft: LlamaForCausalLM | None, num_blocks: int):
        if spec is None:
            return None
        if draft is None:
            return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
        return DraftModelProposer(draft, spec.num_speculative_tokens, self.kv_cache_manager, num_blocks)

    def _propose(self, sampled: dict) -> None:
        """Draft tokens for every running request that got a token this step and is decoding."""
        running = self.scheduler.running
        self.proposer.release({r.request_id for r in running})
        candidates = self.scheduler.draft_candidates(sampled)
        if not candidates:
            return
        ready = [request for request, _ in candidates]
        drafts = self.proposer.propose(ready, [room for _, room in candidates], self._generators)
        for request, draft in zip(ready, drafts):
            request.spec_token_ids, request.spec_probs = draft.token_ids, draft.probs
            request.spec_stats.num_proposed_tokens += len(draft.token_ids)

    # --- requests --------------------------------------------------------------------
    def _encode(self, prompt: str | list[int]) -> list[int]:
        ids = list(prompt) if isinstance(prompt, (list, tuple)) else self.tokenizer.encode(prompt)
        if not ids:
            raise ValueError("A prompt needs at least one token.")
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"Prompt token ids must be integers in the model's vocabulary [0, {vocab}), got "
                             f"{bad[:5]}{' ...' if len(bad) > 5 else ''}.")
        if len(ids) > self.scheduler_config.max_model_len:
            raise ValueError(
                f"The prompt has {len(ids)} tokens, more than max_model_len={self.scheduler_config.max_model_len}; "
                f"shorten the prompt or raise max_model_len."
            )
        return ids

    def _check_request(self, params: SamplingParams, priority: int) -> None:
        """Refuse what this engine cannot serve, before anything is queued (vLLM's messages)."""
        if priority != 0 and self.scheduler_config.policy != "priority":
            raise ValueError(f"Got priority {priority}, but priority scheduling is off: create the LLM with "
                             'scheduling_policy="priority".')
        vocab = self.model.config.vocab_size
        outside = [t for t in params.stop_token_ids if t >= vocab]
        if outside:
            raise ValueError(f"stop_token_ids must be in the model's vocabulary [0, {vocab}), got {outside}.")
        wanted = self.model.config.vocab_size if params.logprobs == -1 else params.logprobs
        if wanted is not None and wanted > self.max_logprobs:
            raise ValueError(f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
                             f"{self.max_logprobs} (raise LLM(max_logprobs=...)).")

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    cache_salt: str | None = None, request_id: str | None = None, priority: int = 0) -> list[str]:
        """Queue a prompt; ``params.n`` samples become sibling requests that share the prompt's
        cached blocks. ``priority`` (lower runs first) needs ``scheduling_policy="priority"``.
        Returns the request ids."""
        params = params or SamplingParams()
        self._check_open()
        self._check_request(params, priority)
        prompt_ids = self._encode(prompt)
        base = request_id or self._next_id(params.n)
        ids = [base] if params.n == 1 else [f"{base}.{i}" for i in range(params.n)]
        for child_id in ids:  # vLLM V1 refuses an id already in flight
            if child_id in self.scheduler.requests:
                raise ValueError(f"The request id {child_id!r} is already in flight; use another, or abort it "
                                 "first (abort_request).")
        if params.n > 1:
            self._siblings[base] = ids
        for i, child_id in enumerate(ids):
            child = replace(params, n=1, seed=None if params.seed is None else params.seed + i)
            self._generators[child_id] = (self._engine_generator if child.seed is None
                                          else torch.Generator().manual_seed(child.seed))
            self.scheduler.add_request(Request(
                child_id, prompt_ids, child, self.model.config.eos_token_ids, time.perf_counter(),
                self.cache_config.block_size, self.scheduler_config.max_model_len, cache_salt, priority,
                functools.partial(self.tokenizer.decode, skip_special_tokens=child.skip_special_tokens)
                if child.stop else None,
                spec_stats=SpecDecodeStats(self.speculative_config.num_speculative_tokens)
                if self.speculative_config else None))
        return ids

    def _next_id(self, n: int = 1) -> str:
        """The next number not in flight (as a request id, or as the prefix of its n samples' ids)."""
        while True:
            base = str(next(self._ids))
            if not any(i in self.scheduler.requests for i in ([base] if n == 1 else [f"{base}.{k}" for k in range(n)])):
                return base

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Stop requests (waiting, running or preempted) and free their blocks, as vLLM's
        ``LLMEngine.abort_request``: a request id of ``n`` samples aborts them all; ids not in
        flight (finished, or never added) are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self._abort([child for rid in ids for child in self._siblings.pop(rid, [rid])])

    def _abort(self, request_ids) -> None:
        scheduler = self.scheduler
        for request_id in request_ids:
            request = scheduler.requests.pop(request_id, None)
            if request is None:
                continue
            if request in scheduler.running:
                scheduler.running.remove(request)
            elif request in scheduler.waiting:
                scheduler.waiting.remove(request)
            self.kv_cache_manager.free(request)  # blocks no forward pass has written leave the prefix cache
            scheduler.free_cpu_blocks.extend(scheduler.swapped.pop(request_id, []))
            self._generators.pop(request_id, None)
            request.spec_token_ids, request.spec_probs = [], None
        if self.proposer is not None:  # a draft model's state of aborted requests, before an id can be reused
            self.proposer.release({r.request_id for r in scheduler.running})

    # --- the engine loop ---------------------------------------------------------------
    def step(self) -> list[Request]:
        """Schedule and run one step; return the requests that finished in it. If the step fails,
        its requests (those scheduled or preempted in it) are aborted, their blocks freed, the KV
        offload tier's copies it planned forgotten, and the error raised: the next step serves the others."""
        running = list(self.scheduler.running)
        plan = None
        try:
            plan = self.scheduler.schedule()
            return self._step(plan)
        except BaseException:
            failed = ([*running, *self.scheduler.running] if plan is None
                      else [*plan.num_scheduled_tokens, *plan.preempted])
            self._abort([r if isinstance(r, str) else r.request_id for r in failed])
            if plan is not None:
                self.kv_cache_manager.forget_transfers(plan.kv_offload, plan.kv_reload)
            raise

    def _step(self, plan) -> list[Request]:
        started = time.perf_counter()
        sampled, logprobs, model_time = {}, {}, 0.0
        if plan.num_scheduled_tokens:
            tables = {rid: self.kv_cache_manager.block_ids(rid) for rid in plan.num_scheduled_tokens}
            batch = prepare(plan, self.scheduler.requests, tables, self.cache_config.block_size)
            model_started = time.perf_counter()
            sampled, logprobs = self.runner.execute(batch, self._generators)
            model_time = time.perf_counter() - model_started
        finished = self.scheduler.update_from_output(plan, sampled, time.perf_counter(), logprobs)
        if self.proposer is not None:
            proposal_started = time.perf_counter()
            self._propose(sampled)
            model_time += time.perf_counter() - proposal_started  # the draft model's forward passes
        pool = self.kv_cache_manager.block_pool
        self.step_trace.append(StepRecord(
            step=len(self.step_trace), scheduled=dict(plan.num_scheduled_tokens),
            waiting=[r.request_id for r in self.scheduler.waiting],
            running=[r.request_id for r in self.scheduler.running],
            blocks_used=pool.num_blocks - pool.num_free_blocks, blocks_free=pool.num_free_blocks,
            prefix_hit_tokens=plan.prefix_hit_tokens, preempted=list(plan.preempted),
            kv_offload_blocks=len(plan.kv_offload), kv_reload_blocks=len(plan.kv_reload),
            wall_time_s=time.perf_counter() - started, model_time_s=model_time))
        for request in finished:
            self._generators.pop(request.request_id, None)
            parent = request.request_id.rpartition(".")[0]
            if parent in self._siblings and not any(i in self.scheduler.requests for i in self._siblings[parent]):
                del self._siblings[parent]
            if request.spec_stats is not None:
                self.spec_decode_stats.merge(request.spec_stats)
        return finished

    def generate(self, prompts: str | dict | list[str] | list[list[int]] | list[dict],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 cache_salt: str | None = None, on_step: Callable[[int], None] | None = None,
                 priority: list[int] | None = None, use_tqdm: bool | Callable = True,
                 **vllm_arguments) -> list[RequestOutput]:
        """Generate for every prompt (outputs in the given order); a prompt is text, token ids, or vLLM's
        ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``. ``sampling_params`` is one for all
        prompts or a list with one per prompt, as is ``priority``; ``on_step(step)`` reports progress,
        as does vLLM's bar while ``use_tqdm`` (``engine/progress.py``)."""
        check_arguments("generate", vllm_arguments)
        single = isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int))
        prompts = [_prompt_of(prompt) for prompt in ([prompts] if single else prompts)]
        self._check_open()
        params = _one_per_prompt(sampling_params, len(prompts), "sampling_params")
        priorities = _one_per_prompt(priority if priority is not None else 0, len(prompts), "priority")
        encoded = [self._encode(prompt) for prompt in prompts]  # every prompt is valid before any work starts
        for one, rank in zip(params, priorities):
            self._check_request(one or SamplingParams(), rank)
        samples = sum((one or SamplingParams()).n for one in params)
        bar = ProgressBar(use_tqdm, len(self.scheduler.requests) + samples)  # vLLM's: all samples in flight
        groups = []
        try:  # an exception out of here (Ctrl-C, on_step's) aborts what this call queued
            for prompt, prompt_ids, one, rank in zip(prompts, encoded, params, priorities):
                request_id = self._next_id((one or SamplingParams()).n)
                groups.append((request_id, prompt, self.add_request(prompt_ids, one, cache_salt, request_id, rank)))
            done: dict[str, Request] = {}
            while self.scheduler.has_unfinished_requests():
                finished = self.step()
                done.update((request.request_id, request) for request in finished)
                bar.update(finished)
                if on_step is not None:
                    on_step(len(self.step_trace))
        except BaseException:
            self.abort_request([request_id for request_id, _, _ in groups])
            raise
        finally:
            bar.close()
        for request_id, _, _ in groups:
            self._siblings.pop(request_id, None)
        return [self._output(request_id, prompt, [done[i] for i in ids]) for request_id, prompt, ids in groups]

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool | Callable = True, add_generation_prompt: bool = True,
             **vllm_arguments) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: each conversation (a list of ``{"role", "content"}`` dicts) rendered by the
        tokenizer's chat template, then generated from. A tokenizer without one is refused, as vLLM does:
        the course's byte-level models have none, so they take plain text through ``generate``."""
        check_arguments("chat", vllm_arguments)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{CHAT_TEMPLATE_MISSING}. This model's tokenizer has no chat template: call "
                             "generate with the conversation written out as text instead.")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(conversation, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
                   for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def beam_search(self, *args, **kwargs):
        """vLLM's ``LLM.beam_search``, which this engine does not have: refused with what to do instead."""
        raise ValueError(BEAM_SEARCH_REFUSAL)

    def _check_open(self) -> None:
        """Refuse new work once the tensor-parallel workers are gone (before anything is queued)."""
        if isinstance(self.runner, TensorParallelRunner):
            self.runner.check_open()

    def close(self) -> None:
        """Stop the tensor-parallel rank workers (nothing to do at ``tensor_parallel_size=1``)."""
        if isinstance(self.runner, TensorParallelRunner):
            self.runner.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (GPU and offload tier), as vLLM's ``LLM.reset_prefix_cache``;
        False (nothing reset) while requests hold blocks. The metrics' counters keep counting."""
        return self.kv_cache_manager.reset_prefix_cache()

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges under vLLM's metric names (``LLM.get_metrics``)."""
        return engine_metrics(self.scheduler, self.kv_cache_manager, getattr(self.speculative_config, "num_speculative_tokens", 0))

    def _completion(self, index: int, request: Request) -> CompletionOutput:
        """One finished request as vLLM reports it: the text stops before a stop string or stop token
        (EOS included), or, with ``include_stop_str_in_output``, just after it."""
        ids, params = list(request.output_token_ids), request.sampling_params
        stopped_on_token = request.status is RequestStatus.FINISHED_STOPPED and request.stop_text_end is None
        cut = stopped_on_token and not params.include_stop_str_in_output
        text = self.tokenizer.decode(ids[:-1] if cut else ids, skip_special_tokens=params.skip_special_tokens)
        if request.stop_text_end is not None:
            text = text[:request.stop_text_end + (len(request.stop_reason) if params.include_stop_str_in_output else 0)]
        logprobs = cumulative = None
        if request.logprobs is not None:
            decode = self.tokenizer.decode
            logprobs = [{token: replace(entry, decoded_token=decode([token])) for token, entry in step.items()}
                        for step in request.logprobs]
            cumulative = sum(step[token].logprob for step, token in zip(logprobs, ids))
        return CompletionOutput(index, text, ids, "stop" if request.status is RequestStatus.FINISHED_STOPPED
                                else "length", request.stop_reason, logprobs, cumulative)

    def _output(self, request_id: str, prompt, requests: list[Request]) -> RequestOutput:
        completions = [self._completion(i, r) for i, r in enumerate(requests)]
        first = requests[0]
        return RequestOutput(request_id, prompt if isinstance(prompt, str) else None,
                             list(first.prompt_token_ids), completions,
                             [RequestMetrics(r.arrival_time, list(r.token_times), r.spec_stats) for r in requests],
                             max(0, first.num_cached_tokens), finished=all(r.finished for r in requests))
