"""GPU presets: the memory a serving engine can carve its KV cache from.

Memory sizes are the cards' marketed capacities read as GiB, which is what
``torch.cuda.mem_get_info`` reports (to within the driver's own reservation).
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

    def __post_init__(self) -> None:
        require_positive("GPU.memory_bytes", self.memory_bytes)


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU("L4-24GB", 24 * GiB),
        GPU("A100-40GB", 40 * GiB),
        GPU("A100-80GB", 80 * GiB),
        GPU("H100-80GB", 80 * GiB),
        GPU("H200-141GB", 141 * GiB),
    )
}


def get_gpu(name: str) -> GPU:
    """Look up a GPU preset by name; the error lists the known names."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"Unknown GPU {name!r}; choose one of {sorted(GPUS)}.") from None
