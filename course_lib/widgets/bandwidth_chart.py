"""An nccl-tests-style result (``course_lib.collectives.bench``) as curves: bandwidth against
message size, one curve per collective, with a switch between algbw and busbw."""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from course_lib.collectives.bench import BenchResult, load_result, saved_results
from course_lib.perf.bus_bandwidth import COLLECTIVES, bus_factor
from course_lib.perf.hardware import match_gpu
from course_lib.perf.units import format_bytes, format_duration
from course_lib.widgets.log_ticks import bytes_ticks, time_ticks
from course_lib.widgets.plotly_pane import PlotlyPane

METRICS = {"busbw": "bus bandwidth (GB/s)", "algbw": "algorithm bandwidth (GB/s)", "time_us": "time per call"}


def link_peak_gbps(result: BenchResult) -> float | None:
    """The peak, in GB/s each way, that a one-node GPU run's busbw is judged against: the GPU
    preset's NVLink (PCIe where it has none). None for CPU runs, unknown GPUs and runs across
    nodes (there the network and the number of NICs per node set it)."""
    gpu = match_gpu(result.device)
    if gpu is None or result.num_nodes != 1:
        return None
    return (gpu.nvlink_bandwidth / 2 or gpu.pcie_bandwidth) / 1e9


def bandwidth_figure(result: BenchResult, metric: str = "busbw", peak_gbps: float | None = None,
                     title: str | None = None) -> go.Figure:
    """One curve per collective of ``metric`` against message size (log-log for time, drawn in
    seconds with a unit on every tick; log-x otherwise); ``peak_gbps`` draws the link's peak to judge
    busbw against. Hovering a point gives its size, time and both bandwidths, each with its unit."""
    if metric not in METRICS:
        raise ValueError(f"Unknown metric {metric!r}; choose one of {list(METRICS)}.")
    timing = metric == "time_us"
    figure = go.Figure()
    for collective in COLLECTIVES:
        rows = [row for row in result.rows if row.collective == collective]
        if not rows:
            continue
        factor = bus_factor(collective, result.world_size)
        figure.add_trace(go.Scatter(
            x=[row.size for row in rows], y=[row.time_us * 1e-6 if timing else getattr(row, metric) for row in rows],
            mode="lines+markers", name=f"{collective} (busbw = algbw x {factor:.3g})",
            customdata=[[format_bytes(row.size, whole=True), format_duration(row.time_us * 1e-6), row.algbw,
                         row.busbw] for row in rows],
            hovertemplate=f"{collective}, %{{customdata[0]}}: %{{customdata[1]}}, algbw %{{customdata[2]:.3f}} GB/s, "
                          "busbw %{customdata[3]:.3f} GB/s<extra></extra>"))
    if peak_gbps is not None and not timing:
        figure.add_hline(y=peak_gbps, line_dash="dash", line_color="grey", annotation_text=f"peak {peak_gbps:g} GB/s")
    sizes = sorted({row.size for row in result.rows})
    times = [row.time_us * 1e-6 for row in result.rows if row.time_us > 0]
    figure.update_layout(
        title=title or f"{result.world_size} ranks, backend {result.backend}, {result.dtype} ({result.device})",
        xaxis={"type": "log", "title": "message size (bytes, log scale)",
               **(bytes_ticks(sizes[0], sizes[-1], step=4) if sizes else {})},
        margin={"t": 60},
        yaxis={"type": "log", "title": "time per call (log scale)", **(time_ticks(min(times), max(times)) if times
                                                                      else {})} if timing
        else {"type": "linear", "title": METRICS[metric], "rangemode": "tozero"},
        height=430, legend={"orientation": "h", "y": -0.25})
    return figure


class BandwidthChart(w.VBox):
    """The figure with a metric switch; hovering a point gives all three numbers of its row."""

    def __init__(self, result: BenchResult, metric: str = "busbw", peak_gbps: float | None = None,
                 title: str | None = None) -> None:
        self.result, self.peak_gbps, self.title = result, peak_gbps, title
        self.metric = w.ToggleButtons(options=[(label, key) for key, label in METRICS.items()], value=metric,
                                      style={"button_width": "220px"})
        self.pane = PlotlyPane()
        self.metric.observe(self._redraw, "value")
        self._redraw()
        super().__init__([self.metric, self.pane])

    def _redraw(self, *_) -> None:
        self.pane.show(bandwidth_figure(self.result, self.metric.value, self.peak_gbps, self.title))


def show_saved_runs() -> None:
    """Display a ``BandwidthChart`` for every GPU run ``./course gpu-report`` saved (``bench.saved_results``),
    each against its own link's peak (``link_peak_gbps``); where none is saved, say how to make one."""
    saved = saved_results()
    if not saved:
        print("No GPU run saved yet. On a machine with 2 or more GPUs, the command ./course gpu-report writes "
              "benchmarks/results/nccl_bench_<gpu>.json, and this cell then draws it.")  # plain text: no Markdown
    for path in saved:
        run = load_result(path)
        display(BandwidthChart(run, peak_gbps=link_peak_gbps(run),
                               title=f"{run.world_size} x {run.device}, {run.backend} ({path.name})"))
