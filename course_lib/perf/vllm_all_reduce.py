"""Where current vLLM sends one tensor-parallel all-reduce on NVIDIA GPUs, as its code decides it.

Read in vllm-project/vllm: ``vllm/distributed/device_communicators/cuda_communicator.py``,
``custom_all_reduce.py`` and ``all_reduce_utils.py`` at commit 00d618aa, ``symm_mem.py`` at
00859a52, and the kernel switch in ``csrc/custom_all_reduce.cuh`` (the same thresholds since
2024). With vLLM's defaults (``VLLM_ALLREDUCE_USE_SYMM_MEM=1``; ``VLLM_ALLREDUCE_USE_FLASHINFER``
and ``VLLM_USE_NCCL_SYMM_MEM`` off; custom all-reduce not disabled), ``CudaCommunicator.all_reduce``
takes the first path that accepts a bf16 message of K bytes on N GPUs of one node:

1. **vLLM's custom all-reduce** (``CustomAllreduce.should_custom_ar``): N in 2, 4, 6, 8; more than
   2 GPUs only when every pair is NVLink-connected (a larger PCIe group is left to NCCL); K a
   multiple of 16 and strictly below its buffer, 8 MiB (``CUSTOM_BUFFER``). When PyTorch's
   symmetric memory is up (next path), the buffer is capped further per GPU generation and N
   (``CUSTOM_CAP``: on H100s 256 KiB at N = 8). Inside, the kernel runs one-shot ("1stage") on 2
   GPUs, and on more below ``ONE_SHOT_BELOW`` (512 KiB up to 4 GPUs, 256 KiB up to 8), two-shot
   ("2stage") from there.
2. **PyTorch's symmetric memory** (``SymmMemCommunicator``): bf16 messages up to and including
   ``SYMM_MEM_MAX`` (64 MiB on 8 H100s), with the multimem all-reduce, in which the NVSwitch adds
   the buffers itself, on the sizes of ``MULTIMEM_SIZES``, PyTorch's two-shot otherwise. It needs
   an architecture listed in those tables and multicast (NVSwitch); elsewhere (an A100, PCIe) it
   stays off and the custom buffer keeps its 8 MiB.
3. **NCCL** (pynccl) for everything else.

So on 8 H100s a 256 KiB message, 16 tokens of a hidden size of 8192, is not the custom kernel's
(256 KiB is not below 256 KiB) and goes to the multimem all-reduce; one byte-aligned step below it,
the custom kernel runs one-shot. Invariant: ``route`` is piecewise constant in K, changing only at
the thresholds ``segments`` lists.
"""

from __future__ import annotations

from course_lib.checks import require_count
from course_lib.perf.units import KiB, MiB, format_bytes

HOPPER, BLACKWELL = "9.0", "10.0"
"""CUDA compute capabilities: H100 and H200 (sm_90), B200 (sm_100). Others (A100: 8.0) have no
entry in vLLM's symmetric-memory tables."""
GPU_NAMES = {HOPPER: "H100s", BLACKWELL: "B200s"}

CUSTOM_SIZES = (2, 4, 6, 8)
PCIE_GROUP_MAX = 2
"""The largest group the custom all-reduce serves when some pair of its GPUs has no NVLink (PCIe)."""
CUSTOM_BUFFER = 8 * MiB
CUSTOM_CAP: dict[str, dict[int, int]] = {
    HOPPER: {2: 64 * MiB, 4: 32 * MiB, 6: 512 * KiB, 8: 256 * KiB},
    BLACKWELL: {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
}
"""``CUSTOM_ALL_REDUCE_MAX_SIZES``: the custom all-reduce's buffer, min'd with ``CUSTOM_BUFFER``,
when symmetric memory is on."""
ONE_SHOT_BELOW: dict[int, int] = {4: 512 * KiB, 6: 256 * KiB, 8: 256 * KiB}
"""The custom kernel's switch on NVLink-connected GPUs: one-shot strictly below, two-shot from it;
on 2 GPUs one-shot always."""
SYMM_MEM_MAX: dict[str, dict[int, int]] = {
    HOPPER: {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    BLACKWELL: {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
}
"""``SYMM_MEM_ALL_REDUCE_MAX_SIZES``: the largest message (inclusive) PyTorch's kernels take."""
MULTIMEM_SIZES: dict[str, tuple[int, ...]] = {HOPPER: (4, 6, 8), BLACKWELL: (6, 8)}
"""Where the symmetric-memory path runs the multimem all-reduce rather than two-shot."""

CUSTOM_ONE_SHOT = "one-shot (vLLM's custom all-reduce)"
CUSTOM_TWO_SHOT = "two-shot (vLLM's custom all-reduce)"
MULTIMEM = "multimem (PyTorch's symmetric memory)"
SYMM_TWO_SHOT = "two-shot (PyTorch's symmetric memory)"
NCCL = "NCCL"
ALGORITHMS = {CUSTOM_ONE_SHOT: "one-shot", CUSTOM_TWO_SHOT: "two-shot", MULTIMEM: "multimem",
              SYMM_TWO_SHOT: "two-shot", NCCL: "NCCL"}
"""Each route's algorithm, in the words of ``tp_all_reduce`` (whose model has no multimem)."""
ALIGNMENT = 16
"""The custom all-reduce takes only messages of a multiple of 16 bytes; sizes here are such."""


def _symmetric_memory_on(num_ranks: int, capability: str, nvswitch: bool) -> bool:
    return nvswitch and num_ranks in SYMM_MEM_MAX.get(capability, {})


def custom_limit(num_ranks: int, capability: str = HOPPER, nvswitch: bool = True) -> int | None:
    """The custom all-reduce takes messages strictly below this many bytes; None where it is off
    (N not 2, 4, 6 or 8, or more than 2 GPUs without NVLink between every pair)."""
    require_count("num_ranks", num_ranks)
    if num_ranks not in CUSTOM_SIZES or (num_ranks > PCIE_GROUP_MAX and not nvswitch):
        return None
    if _symmetric_memory_on(num_ranks, capability, nvswitch) and capability in CUSTOM_CAP:
        return min(CUSTOM_CAP[capability][num_ranks], CUSTOM_BUFFER)
    return CUSTOM_BUFFER


def route(num_ranks: int, num_bytes: int, capability: str = HOPPER, nvswitch: bool = True) -> str:
    """Which all-reduce vLLM runs for one bf16 message of ``num_bytes`` (a multiple of 16) on
    ``num_ranks`` GPUs of compute ``capability`` in one node, NVLink through an NVSwitch between
    every pair (``nvswitch``) or PCIe: one of ``ALGORITHMS``' keys."""
    if num_bytes <= 0 or num_bytes % ALIGNMENT:
        raise ValueError(f"A message of {num_bytes} bytes: give a positive multiple of {ALIGNMENT} (bf16 tensors "
                         "that vLLM's custom all-reduce can take).")
    limit = custom_limit(num_ranks, capability, nvswitch)
    if limit is not None and num_bytes < limit:
        one_shot = num_ranks == 2 or num_bytes < ONE_SHOT_BELOW[num_ranks]
        return CUSTOM_ONE_SHOT if one_shot else CUSTOM_TWO_SHOT
    if _symmetric_memory_on(num_ranks, capability, nvswitch) and num_bytes <= SYMM_MEM_MAX[capability][num_ranks]:
        return MULTIMEM if num_ranks in MULTIMEM_SIZES.get(capability, ()) else SYMM_TWO_SHOT
    return NCCL


def segments(num_ranks: int, capability: str = HOPPER, nvswitch: bool = True) -> list[tuple[int, int | None, str]]:
    """``route`` over every message size as (first bytes, last bytes or None for no end, route),
    in order; neighbouring segments have different routes."""
    points = {ALIGNMENT}
    limit = custom_limit(num_ranks, capability, nvswitch)
    if limit is not None:
        points |= {limit, ONE_SHOT_BELOW.get(num_ranks, limit)}
    if _symmetric_memory_on(num_ranks, capability, nvswitch):
        points.add(SYMM_MEM_MAX[capability][num_ranks] + ALIGNMENT)
    found: list[tuple[int, int | None, str]] = []
    for start in sorted(points):
        here = route(num_ranks, start, capability, nvswitch)
        if found and found[-1][2] == here:
            continue
        if found:
            found[-1] = (found[-1][0], start - ALIGNMENT, found[-1][2])
        found.append((start, None, here))
    return found


def one_shot_below(num_ranks: int, capability: str = HOPPER, nvswitch: bool = True) -> int | None:
    """The size from which vLLM stops running one-shot; None if it never runs it (no custom path)."""
    _, end, first = segments(num_ranks, capability, nvswitch)[0]
    return None if first != CUSTOM_ONE_SHOT else end + ALIGNMENT


def phrases(num_ranks: int, capability: str = HOPPER, nvswitch: bool = True) -> list[str]:
    """``segments`` in words, one phrase each, by where it starts: ["one-shot (...) below 256.0 KiB",
    "multimem (...) from 256.0 KiB", "NCCL above 64.0 MiB"] (above: symmetric memory's limit is
    inclusive); ["NCCL at every size"] where vLLM has no other path."""
    found = segments(num_ranks, capability, nvswitch)
    if len(found) == 1:
        return [f"{found[0][2]} at every size"]
    parts, previous = [], None
    for start, end, name in found:
        if start == ALIGNMENT:
            parts.append(f"{name} below {format_bytes(end + ALIGNMENT)}")
        elif previous in (MULTIMEM, SYMM_TWO_SHOT):
            parts.append(f"{name} above {format_bytes(start - ALIGNMENT)}")
        else:
            parts.append(f"{name} from {format_bytes(start)}")
        previous = name
    return parts


def describe(num_ranks: int, capability: str = HOPPER, nvswitch: bool = True) -> str:
    """``phrases`` joined in one line."""
    return ", ".join(phrases(num_ranks, capability, nvswitch))
