"""GPU presets: memory, peak HBM bandwidth, peak dense FLOP/s, and interconnect bandwidths.

Sources: NVIDIA's datasheets for the A100 (SXM), H100 (SXM), H200 (SXM), B200 (HGX) and L4;
dense (not sparse) tensor-core peaks; fp8 is 0 where the chip has no fp8 tensor cores.
Memory is what the driver reports (``nvidia-smi``, ``torch.cuda.mem_get_info``): the L4, sold
as a 24 GB card, reports 23,034 MiB (22.5 GiB); for the others the marketed capacity read as
GiB is within 1% of the driver's figure. NVLink is the per-GPU aggregate (0: none); PCIe is
one direction of an x16 link (Gen4 ~32 GB/s, Gen5 ~64 GB/s); network is the scale-out NIC per
GPU: HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s (ConnectX-7, in DGX/HGX H100, H200 and
B200); 800 Gb/s (ConnectX-8) comes with the B300. SM counts: L4 58, A100 108, H100/H200 SXM 132,
B200 148.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course_lib.checks import require_positive
from course_lib.perf.units import GiB, MiB


@dataclass(frozen=True)
class GPU:
    """One accelerator as the memory planner sees it."""

    name: str
    memory_bytes: int
    hbm_bandwidth: float  # bytes per second, peak
    bf16_flops: float  # dense FLOP/s
    fp8_flops: float  # dense FLOP/s; 0 when unsupported
    nvlink_bandwidth: float  # bytes per second per GPU; 0 when there is no NVLink
    pcie_bandwidth: float  # bytes per second, one direction
    network_bandwidth: float  # bytes per second per GPU
    sm_count: int  # streaming multiprocessors: how many kernel programs run at once, at least

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "hbm_bandwidth", "bf16_flops", "pcie_bandwidth", "network_bandwidth", "sm_count"):
            require_positive(f"GPU.{field}", getattr(self, field))


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU("L4-24GB", 23034 * MiB, 300e9, 121e12, 242e12, 0, 32e9, 25e9, 58),
        GPU("A100-40GB", 40 * GiB, 1.555e12, 312e12, 0, 600e9, 32e9, 25e9, 108),
        GPU("A100-80GB", 80 * GiB, 2.039e12, 312e12, 0, 600e9, 32e9, 25e9, 108),
        GPU("H100-80GB", 80 * GiB, 3.35e12, 989e12, 1979e12, 900e9, 64e9, 50e9, 132),
        GPU("H200-141GB", 141 * GiB, 4.8e12, 989e12, 1979e12, 900e9, 64e9, 50e9, 132),
        GPU("B200-180GB", 180 * GiB, 8e12, 2250e12, 4500e12, 1800e9, 64e9, 50e9, 148),
    )
}


def match_gpu(device_name: str) -> GPU | None:
    """The preset for a CUDA device name such as 'NVIDIA H200' or 'NVIDIA A100-SXM4-80GB', if any."""
    name = device_name.upper()
    candidates = [p for p in GPUS.values() if p.name.split("-")[0] in name]
    if len(candidates) > 1:  # one chip sold with several memory sizes
        candidates = [p for p in candidates if p.name.split("-")[1] in name]
    return candidates[0] if len(candidates) == 1 else None


def get_gpu(name: str) -> GPU:
    """Look up a GPU preset by name; the error lists the known names."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"Unknown GPU {name!r}; choose one of {sorted(GPUS)}.") from None


def tensor_parallel_group(gpu: GPU, size: int) -> GPU:
    """``size`` GPUs serving one model with tensor parallelism, seen by the roofline as one GPU.
    Every weight matrix and KV head is split across them, so a step's bytes and FLOPs are shared
    and memory, HBM bandwidth, FLOP/s, PCIe and network links add up (NVLink stays per GPU).
    Left out: the two all-reduces per layer that join the shards; a caller charges them as a
    per-step overhead (``Efficiency.overhead_s``)."""
    require_positive("size", size)
    if size == 1:
        return gpu
    return replace(gpu, name=f"{size}x {gpu.name} (TP={size})", memory_bytes=gpu.memory_bytes * size,
                   hbm_bandwidth=gpu.hbm_bandwidth * size, bf16_flops=gpu.bf16_flops * size,
                   fp8_flops=gpu.fp8_flops * size, pcie_bandwidth=gpu.pcie_bandwidth * size,
                   network_bandwidth=gpu.network_bandwidth * size, sm_count=gpu.sm_count * size)
