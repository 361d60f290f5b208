"""Which all-reduce a tensor-parallel layer should use: one-shot, two-shot or the ring, in the
alpha-beta model.

Tensor parallelism all-reduces the activations twice per layer (after attention, after the MLP),
tokens x hidden x dtype bytes each time: at decode a few KiB to a few MiB, where the latency of
each round weighs as much as the bytes: one-shot (one round) wins the smallest messages, two-shot
(the ring's bytes in two rounds) the larger ones, from a size K* that falls with N. For a message
of K bytes on N GPUs that can each move B bytes per second to their peers (NVSwitch: every pair
at full speed) and pay alpha seconds per synchronisation round:

  one-shot   t1 = alpha + (N-1) K / B            one round: every rank reads all N-1 peers'
                                                 whole buffers and sums locally
  two-shot   t2 = 2 alpha + 2 (N-1)/N K / B      two rounds over symmetric buffers: reduce-scatter
                                                 (rank r sums slice r of every buffer), then
                                                 all-gather of the reduced slices
  ring       t  = 2 (N-1) alpha + 2 (N-1)/N K / B   the ring of ``course_lib.perf.comm.RING``

One-shot and two-shot are ``AllReduceCost`` objects like the ring, so the crossovers come from
``course_lib.perf.comm.crossover_bytes``. Setting t1 = t2:

  K* = alpha B N / ((N-1)(N-2))       two-shot is faster from K* on; never on N = 2, where both
                                      move K and two-shot pays one more round

and one-shot stops beating the ring at (2N-3) K* (never on N = 2: the ring pays 2 alphas for
one-shot's one, and the same K / B). In this model two-shot never loses to the ring (same
bytes, 2 rounds instead of 2(N-1); equal on N = 2): inside one NVSwitch node the ring's one
virtue, needing only neighbour links, buys nothing. Left out: the reads' contention in the
switch, the kernel launch, and NCCL's pipelining of the ring (its LL protocols), so read the
crossovers as orders of magnitude; ``course_lib.collectives.symmetric.benchmark`` measures the
real ones on CPU ranks.

Defaults: the ``NVLINK_4`` preset of ``course_lib.perf.interconnect`` (H100 SXM, 450 GB/s each
way: NVIDIA's datasheet's 900 GB/s counts both directions; alpha 1 us, a typical order of
magnitude, not a measurement).

vLLM chooses by measured thresholds instead, and has a third algorithm for larger messages
(``course_lib.perf.vllm_all_reduce``: on 8 H100s its custom kernel's one-shot below 256 KiB,
PyTorch's multimem all-reduce from there); ``alpha_for_crossover`` gives the alpha at which this
model would stop one-shot where vLLM does, and ``crossover_in_tokens`` states both, in bytes and
in tokens of a model's activations.
"""

from __future__ import annotations

from course_lib.checks import require_count, require_positive
from course_lib.perf.comm import RING, AllReduceCost, crossover_bytes
from course_lib.perf import vllm_all_reduce
from course_lib.perf.comm_roofline import BF16_BYTES
from course_lib.perf.interconnect import NVLINK_4, get_link
from course_lib.perf.units import format_bytes

DEFAULT_LINK = get_link(NVLINK_4)
"""Where the defaults come from: NVLink 4 on H100, alpha 1 us, 450 GB/s per GPU each way."""
DEFAULT_ALPHA_S = DEFAULT_LINK.alpha_s
DEFAULT_BANDWIDTH = DEFAULT_LINK.bandwidth

ONE_SHOT = AllReduceCost("one-shot", lambda n: 1, lambda n: n - 1)
TWO_SHOT = AllReduceCost("two-shot", lambda n: 2, lambda n: 2 * (n - 1) / n)
TP_ALGORITHMS: dict[str, AllReduceCost] = {cost.name: cost for cost in (ONE_SHOT, TWO_SHOT, RING)}
"""The three contenders by name: "one-shot", "two-shot", "ring" (the ring is perf.comm's)."""

ALL_REDUCES_PER_LAYER = 2
"""A transformer layer under tensor parallelism all-reduces twice forward: after attention's
row-parallel output projection and after the MLP's row-parallel down projection."""


def _check(num_ranks: int, alpha_s: float, bandwidth: float) -> None:
    require_count("num_ranks", num_ranks)
    require_positive("alpha_s", alpha_s)
    require_positive("bandwidth", bandwidth)


def all_reduce_time(algorithm: str, num_ranks: int, num_bytes: float, alpha_s: float = DEFAULT_ALPHA_S,
                    bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """Seconds for ``algorithm`` ("one-shot", "two-shot" or "ring") to all-reduce ``num_bytes``
    on ``num_ranks`` GPUs of ``bandwidth`` bytes/s each, ``alpha_s`` per round. 0 on one rank;
    continuous and increasing in the bytes."""
    if algorithm not in TP_ALGORITHMS:
        raise KeyError(f"Unknown all-reduce {algorithm!r}; choose one of {list(TP_ALGORITHMS)}.")
    _check(num_ranks, alpha_s, bandwidth)
    return TP_ALGORITHMS[algorithm].time(num_ranks, num_bytes, alpha_s, 1 / bandwidth)


def one_shot_time(num_ranks: int, num_bytes: float, alpha_s: float = DEFAULT_ALPHA_S,
                  bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """alpha + (N-1) K / B (0 on one rank)."""
    return all_reduce_time("one-shot", num_ranks, num_bytes, alpha_s, bandwidth)


def two_shot_time(num_ranks: int, num_bytes: float, alpha_s: float = DEFAULT_ALPHA_S,
                  bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """2 alpha + 2 (N-1)/N K / B (0 on one rank)."""
    return all_reduce_time("two-shot", num_ranks, num_bytes, alpha_s, bandwidth)


def ring_time(num_ranks: int, num_bytes: float, alpha_s: float = DEFAULT_ALPHA_S,
              bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """2 (N-1) alpha + 2 (N-1)/N K / B (0 on one rank): ``course_lib.perf.comm.RING``."""
    return all_reduce_time("ring", num_ranks, num_bytes, alpha_s, bandwidth)


def fastest(num_ranks: int, num_bytes: float, alpha_s: float = DEFAULT_ALPHA_S,
            bandwidth: float = DEFAULT_BANDWIDTH) -> str:
    """The name of the quickest algorithm for this message; on a tie the one listed first in
    ``TP_ALGORITHMS`` (one-shot, two-shot, ring), so one-shot at exactly K*."""
    times = {name: all_reduce_time(name, num_ranks, num_bytes, alpha_s, bandwidth) for name in TP_ALGORITHMS}
    return min(times, key=times.get)


def two_shot_crossover_bytes(num_ranks: int, alpha_s: float = DEFAULT_ALPHA_S,
                             bandwidth: float = DEFAULT_BANDWIDTH) -> float | None:
    """K* = alpha B N / ((N-1)(N-2)): below it one-shot is faster, from it on two-shot; None
    for N <= 2, where two-shot never overtakes. It grows with alpha and B and falls with N."""
    _check(num_ranks, alpha_s, bandwidth)
    return crossover_bytes(ONE_SHOT, TWO_SHOT, num_ranks, alpha_s, 1 / bandwidth)


def one_shot_ring_crossover_bytes(num_ranks: int, alpha_s: float = DEFAULT_ALPHA_S,
                                  bandwidth: float = DEFAULT_BANDWIDTH) -> float | None:
    """Where one-shot stops beating the ring: (2N-3) alpha B N / ((N-1)(N-2)) = (2N-3) K*;
    None for N <= 2 (one-shot is faster at every size)."""
    _check(num_ranks, alpha_s, bandwidth)
    return crossover_bytes(ONE_SHOT, RING, num_ranks, alpha_s, 1 / bandwidth)


def tp_message_bytes(tokens: int, hidden: int, dtype_bytes: int = BF16_BYTES) -> int:
    """Bytes of one tensor-parallel all-reduce: the activations, tokens x hidden x dtype bytes
    (bf16: 2). At decode ``tokens`` is the batch size, at prefill the prompt tokens."""
    for name, value in (("tokens", tokens), ("hidden", hidden), ("dtype_bytes", dtype_bytes)):
        require_count(name, value)
    return tokens * hidden * dtype_bytes


def tp_all_reduces_per_forward(num_layers: int) -> int:
    """All-reduces in one forward pass: ``ALL_REDUCES_PER_LAYER`` (2) per layer."""
    require_count("num_layers", num_layers)
    return ALL_REDUCES_PER_LAYER * num_layers


def alpha_for_crossover(num_ranks: int, crossover_bytes: float, bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """The alpha per round that puts K* at ``crossover_bytes``: K* (N-1)(N-2) / (B N), inverting
    ``two_shot_crossover_bytes``; only for N >= 3, where two-shot can win at all."""
    if num_ranks < 3:
        raise ValueError(f"two-shot never overtakes one-shot on {num_ranks} GPUs, so no alpha puts a crossover there.")
    require_positive("crossover_bytes", crossover_bytes)
    require_positive("bandwidth", bandwidth)
    return crossover_bytes * (num_ranks - 1) * (num_ranks - 2) / (bandwidth * num_ranks)


def one_shot_max_tokens(num_ranks: int, hidden: int, alpha_s: float = DEFAULT_ALPHA_S,
                        bandwidth: float = DEFAULT_BANDWIDTH, dtype_bytes: int = BF16_BYTES) -> int | None:
    """The largest batch, in tokens of ``hidden`` activations, whose all-reduce ``fastest`` gives
    to one-shot: floor(K* / bytes per token). 0 when even one token goes two-shot; None when
    one-shot wins at every size (N <= 2)."""
    star = two_shot_crossover_bytes(num_ranks, alpha_s, bandwidth)
    return None if star is None else int(star // tp_message_bytes(1, hidden, dtype_bytes))


def crossover_in_tokens(num_ranks: int, hidden: int, alpha_s: float = DEFAULT_ALPHA_S,
                        bandwidth: float = DEFAULT_BANDWIDTH, dtype_bytes: int = BF16_BYTES,
                        capability: str = vllm_all_reduce.HOPPER) -> str:
    """A few short lines: where two-shot overtakes one-shot on ``num_ranks`` GPUs in this model, in
    tokens of ``hidden`` activations and in bytes; then what vLLM runs at each size on GPUs of that
    compute ``capability`` (``vllm_all_reduce.phrases``, its one-shot range in tokens too), and
    the alpha at which this model would leave one-shot where vLLM does."""
    per_token = tp_message_bytes(1, hidden, dtype_bytes)
    most = one_shot_max_tokens(num_ranks, hidden, alpha_s, bandwidth, dtype_bytes)
    if most is None:
        model = "one-shot at every size (two-shot never wins)"
    else:
        star = format_bytes(two_shot_crossover_bytes(num_ranks, alpha_s, bandwidth))
        model = (f"one-shot for 1 to {most} tokens, two-shot from {most + 1} (K* = {star})" if most else
                 f"two-shot from a single token (K* = {star})")
    gpus = vllm_all_reduce.GPU_NAMES.get(capability, f"sm_{capability} GPUs")
    lines = [f"N={num_ranks}: this model: {model}", f"     vLLM on {num_ranks} {gpus}, by message size:"]
    limit = vllm_all_reduce.one_shot_below(num_ranks, capability)
    for i, phrase in enumerate(vllm_all_reduce.phrases(num_ranks, capability)):
        tokens = f": 1 to {(limit - 1) // per_token} tokens" if i == 0 and limit is not None else ""
        lines.append(f"       {phrase}{tokens}")
    if limit is not None and num_ranks >= 3:
        lines.append(f"     this model leaves one-shot where vLLM does with α = "
                     f"{alpha_for_crossover(num_ranks, limit, bandwidth) * 1e6:.2f} µs instead of {alpha_s * 1e6:g} µs")
    return "\n".join(lines)
