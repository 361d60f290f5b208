"""Back-of-envelope serving calculators: pool sizing for disaggregated serving, the cost of
moving a KV cache between GPUs, and what speculative decoding gains per target step.

Each function states its formula in its docstring and returns every intermediate, so a
lesson can show the working as well as the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.checks import require_positive, require_probability
from course_lib.perf.hardware import GPU
from course_lib.perf.kv import model_kv_bytes_per_token
from course_lib.perf.models import ModelSpec
from course_lib.perf.roofline import Efficiency, step_cost


@dataclass(frozen=True)
class PDRatio:
    """How many prefill instances one decode instance needs to stay fed."""

    num_seqs: int  # sequences a decode instance runs at once
    tpot_s: float  # time per output token of each of them
    output_len: int  # tokens generated per request
    decode_tokens_per_s: float  # num_seqs / tpot_s
    decode_requests_per_s: float  # decode_tokens_per_s / output_len
    prefill_requests_per_s: float  # requests one prefill instance prefills per second
    prefill_per_decode: float  # decode_requests_per_s / prefill_requests_per_s

    def prefill_instances_for(self, num_decode: int) -> int:
        """Whole prefill instances that keep ``num_decode`` decode instances fed (rounded up)."""
        require_positive("num_decode", num_decode)
        return max(1, math.ceil(round(self.prefill_per_decode * num_decode, 9)))  # 1.28 x 25 = 32, not 33


def pd_ratio(num_seqs: int, tpot_s: float, output_len: int, prefill_requests_per_s: float) -> PDRatio:
    """Prefill instances per decode instance, by matching request rates.

    A decode instance emits ``num_seqs / tpot_s`` tokens per second; each request takes
    ``output_len`` of them, so it finishes ``num_seqs / tpot_s / output_len`` requests per second,
    and the prefill pool must start requests at that rate:
    ``ratio = decode requests/s / prefill requests/s per instance``.
    256 sequences at 40 ms TPOT = 6,400 tok/s; / 500 tokens = 12.8 req/s; against a prefill
    instance serving 10 req/s that is 1.28 prefill instances per decode instance.
    ``prefill_requests_per_s`` may come from measurements or from ``prefill_requests_per_s()``.
    """
    for name, value in (("num_seqs", num_seqs), ("tpot_s", tpot_s), ("output_len", output_len),
                        ("prefill_requests_per_s", prefill_requests_per_s)):
        require_positive(name, value)
    tokens_per_s = num_seqs / tpot_s
    requests_per_s = tokens_per_s / output_len
    return PDRatio(num_seqs, tpot_s, output_len, tokens_per_s, requests_per_s, prefill_requests_per_s,
                   requests_per_s / prefill_requests_per_s)


def prefill_requests_per_s(model: ModelSpec, gpu: GPU, prompt_len: int, prompts_per_step: int = 1,
                           dtype: str = "bf16", efficiency: Efficiency = Efficiency()) -> float:
    """Requests per second one prefill instance serves, from the roofline: steps of
    ``prompts_per_step`` whole prompts of ``prompt_len`` tokens, back to back, so
    ``prompts_per_step / step time``. Long prompts are compute-bound and gain nothing from
    batching; short ones share each step's weight reads."""
    require_positive("prompt_len", prompt_len)
    require_positive("prompts_per_step", prompts_per_step)
    cost = step_cost(model, gpu, [(0, prompt_len)] * prompts_per_step, dtype, efficiency)
    return prompts_per_step / cost.time_s


def decode_tpot_s(model: ModelSpec, gpu: GPU, num_seqs: int, context_len: int, dtype: str = "bf16",
                  efficiency: Efficiency = Efficiency()) -> float:
    """TPOT from the roofline: the time of one decode step of ``num_seqs`` sequences, each with
    ``context_len`` tokens already cached (every sequence gets one token per step)."""
    require_positive("num_seqs", num_seqs)
    require_positive("context_len", context_len)
    return step_cost(model, gpu, [(context_len, 1)] * num_seqs, dtype, efficiency).time_s


@dataclass(frozen=True)
class KVTransfer:
    """Moving ``num_tokens`` tokens of KV cache from a prefill GPU to a decode GPU."""

    num_tokens: int
    bytes: float  # num_tokens x KV bytes per token
    link_bandwidth: float  # bytes per second
    num_layers: int
    time_s: float  # bytes / link_bandwidth: the whole transfer, after the prefill
    per_layer_s: float  # time_s / num_layers
    pipelined: bool
    exposed_s: float  # what the request waits for after its prefill ends


def kv_transfer(model: ModelSpec, num_tokens: int, link_bandwidth: float, kv_dtype: str = "bf16",
                pipelined: bool = False, compute_s: float | None = None) -> KVTransfer:
    """Bytes and time to ship ``num_tokens`` tokens of ``model``'s KV cache over a link.

    bytes = tokens x 2 (K and V) x layers x KV heads x head dim x bytes per element;
    time = bytes / link bandwidth. Sent after the prefill, all of it is exposed.
    Pipelined layer by layer, layer i's KV is sent while later layers compute, so only the last
    layer's share (time / layers) is exposed, provided the link keeps up with the compute.
    Pass the prefill's ``compute_s`` to check that: the first ``layers - 1`` layers' sends can
    hide behind at most ``compute_s x (layers - 1) / layers`` seconds of compute, so
    exposed = max(time / layers, time - compute_s x (layers - 1) / layers).
    10,000 tokens of Llama-3.1-70B in bf16 (320 KiB per token) = 3.28 GB, 65.5 ms at 50 GB/s.
    """
    require_positive("num_tokens", num_tokens)
    require_positive("link_bandwidth", link_bandwidth)
    if compute_s is not None and compute_s < 0:
        raise ValueError(f"compute_s is the prefill's compute time and must be 0 or more, got {compute_s!r}.")
    size = num_tokens * model_kv_bytes_per_token(model, kv_dtype)
    time_s = size / link_bandwidth
    layers = model.num_layers
    per_layer = time_s / layers
    exposed = time_s
    if pipelined:
        exposed = per_layer if compute_s is None else max(per_layer, time_s - compute_s * (layers - 1) / layers)
    return KVTransfer(num_tokens, size, link_bandwidth, layers, time_s, per_layer, pipelined, exposed)


def expected_tokens_per_step(acceptance_rate: float, num_draft_tokens: int) -> float:
    """Tokens one target forward pass yields with ``num_draft_tokens`` (k) drafts, each accepted
    with probability a, independently, until the first rejection:
    1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a), and k + 1 when a = 1.
    (The target always contributes one token: the correction or the bonus.)
    a = 0.8, k = 4 gives 3.3616."""
    require_probability("acceptance_rate", acceptance_rate)
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens must be a whole number 0 or more, got {num_draft_tokens!r}.")
    if acceptance_rate == 1:
        return float(num_draft_tokens + 1)
    return (1 - acceptance_rate ** (num_draft_tokens + 1)) / (1 - acceptance_rate)
