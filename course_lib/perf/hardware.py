"""GPU presets: memory a serving engine can carve its KV cache from, and peak HBM bandwidth.

Memory sizes are the cards' marketed capacities read as GiB, which is what
``torch.cuda.mem_get_info`` reports (to within the driver's own reservation). Bandwidths
are the vendors' peak figures in bytes per second (SXM parts for A100/H100/H200).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.checks import require_positive
from course_lib.perf.units import GiB


@dataclass(frozen=True)
class GPU:
    """One accelerator as the memory planner sees it."""

    name: str
    memory_bytes: int
    hbm_bandwidth: float  # bytes per second, peak

    def __post_init__(self) -> None:
        require_positive("GPU.memory_bytes", self.memory_bytes)
        require_positive("GPU.hbm_bandwidth", self.hbm_bandwidth)


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU("L4-24GB", 24 * GiB, 300e9),
        GPU("A100-40GB", 40 * GiB, 1.555e12),
        GPU("A100-80GB", 80 * GiB, 2.039e12),
        GPU("H100-80GB", 80 * GiB, 3.35e12),
        GPU("H200-141GB", 141 * GiB, 4.8e12),
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
