"""Charts for module 01's measurements: waste and concurrency over a run, savings from sharing."""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_lib.paging.block_table import parallel_sampling_report
from course_lib.paging.simulate import SimulationResult


def plot_allocator_runs(results: dict[str, SimulationResult]):
    """Waste and live requests per decode step, one line per allocator."""
    fig, (waste_ax, count_ax) = plt.subplots(1, 2, figsize=(11, 3.4))
    for name, result in results.items():
        steps = range(len(result.snapshots))
        waste_ax.plot(steps, [100 * s.waste_fraction for s in result.snapshots], label=name)
        count_ax.plot(steps, [s.num_requests for s in result.snapshots], label=name)
    waste_ax.set(title="KV memory wasted", xlabel="decode step", ylabel="waste (% of held memory)", ylim=(0, 100))
    count_ax.set(title="Requests held at once", xlabel="decode step", ylabel="concurrent requests")
    for ax in (waste_ax, count_ax):
        ax.legend()
    fig.tight_layout()
    return fig


def plot_sharing_savings(prompt_lens: list[int], output_len: int, max_samples: int = 8, block_size: int = 16):
    """Share of memory saved by copy-on-write sharing against the number of parallel samples."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    samples = range(1, max_samples + 1)
    for prompt in prompt_lens:
        saved = [100 * parallel_sampling_report(prompt, n, output_len, block_size).saved_fraction for n in samples]
        ax.plot(samples, saved, marker="o", label=f"prompt {prompt} tokens")
    ax.set(title=f"Memory saved by sharing the prompt ({output_len} new tokens per sample)",
           xlabel="parallel samples", ylabel="KV memory saved (%)", ylim=(0, 100))
    ax.legend()
    fig.tight_layout()
    return fig


def plot_decode_bandwidth(results: dict):
    """Share of peak HBM bandwidth reached by the paged decode kernel (and SDPA on contiguous KV),
    from a ``course_lib.kernels.benchmark`` JSON file, or the roofline's prediction of it
    (``course_lib.perf.attention_roofline``), which the title then says."""
    rows, peak = results["rows"], results["peak_hbm_bytes_per_s"]
    predicted = results.get("predicted", False)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        line, = ax.plot([r["context"] for r in mine], [100 * r["paged_gb_per_s"] * 1e9 / peak for r in mine],
                        marker="o", ls=":" if predicted else "-",
                        label=f"{'predicted' if predicted else 'paged Triton'}, batch {batch}")
        if not predicted:
            ax.plot([r["context"] for r in mine], [100 * r["sdpa_gb_per_s"] * 1e9 / peak for r in mine],
                    ls="--", color=line.get_color(), alpha=0.6)
    title = (f"PREDICTED by the roofline model (not measured): decode attention on {results['device']}" if predicted
             else f"Decode attention on {results['device']} (dashed: SDPA on contiguous KV)")
    ax.set(xscale="log", xlabel="context length (tokens)", ylabel="HBM bandwidth (% of peak)", title=title,
           ylim=(0, 105))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
