"""DDP's buckets on a timeline: when each layer's gradients were ready and when each bucket's
all-reduce ran, from a recorded step (``course_lib.collectives.ddp_timeline``), with a
``bucket_cap_mb`` slider over a recorded sweep."""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from course_lib.collectives.ddp_timeline import BucketTimeline
from course_lib.perf.units import format_bytes
from course_lib.widgets.plotly_pane import PlotlyPane
from course_lib.widgets.selection_readout import with_readout

COMPUTE, COMM = "#1f77b4", "#ff7f0e"


def cap_label(bucket_cap_mb: float | None) -> str:
    return "default" if bucket_cap_mb is None else f"{bucket_cap_mb:g} MiB"  # DDP reads bucket_cap_mb as MiB


def layer_names(param_names: list[str]) -> dict[str, str]:
    """Parameter name -> 'layer k': the layers (modules holding parameters, '12.weight' and
    '12.bias' in module '12') numbered 0, 1, ... in ``model.parameters()`` order."""
    modules = list(dict.fromkeys(name.rpartition(".")[0] for name in param_names))
    return {name: f"layer {modules.index(name.rpartition('.')[0])}" for name in param_names}


def _params_text(params: list[str], layers: dict[str, str]) -> str:
    names = list(dict.fromkeys(layers[p] for p in params))
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]} ({len(names)} layers)"


def timeline_figure(timeline: BucketTimeline) -> go.Figure:
    """One row per bucket (its all-reduce, launch to completion) under one row of gradient-ready
    marks (one per layer: when the last of its parameters' gradients was accumulated); times in
    ms after ``loss.backward()`` was called."""
    ms = 1e3
    figure = go.Figure()
    layers = layer_names(timeline.param_names)
    ready = {}
    for name, at in timeline.grad_ready_s.items():
        ready[layers[name]] = max(ready.get(layers[name], 0.0), at)
    figure.add_trace(go.Scatter(x=[t * ms for t in ready.values()], y=["backward: gradients ready"] * len(ready),
                                mode="markers", text=list(ready),
                                marker={"color": COMPUTE, "size": 10, "symbol": "diamond"}, name="gradient ready",
                                hovertemplate="%{text}: ready at %{x:.2f} ms<extra></extra>"))
    rows = [f"bucket {b.index}" for b in timeline.buckets]
    figure.add_trace(go.Bar(y=rows, x=[(b.end_s - b.start_s) * ms for b in timeline.buckets],
                            base=[b.start_s * ms for b in timeline.buckets], orientation="h", marker_color=COMM,
                            name="bucket all-reduce",
                            customdata=[[_params_text(b.params, layers), format_bytes(b.num_bytes)]
                                        for b in timeline.buckets],
                            hovertemplate="%{y}: %{customdata[0]}, %{customdata[1]}<br>"
                                          "launched %{base:.2f} ms, took %{x:.2f} ms<extra></extra>"))
    for at, text, dash, side in ((timeline.compute_end_s, "last gradient ready", "dot", "right"),
                                 (timeline.backward_s, "backward() returns", "dash", "left")):
        figure.add_vline(x=at * ms, line_dash=dash, line_color="grey")
        figure.add_annotation(x=at * ms, y=1.0, yref="paper", yanchor="bottom", xanchor=side, text=text,
                              showarrow=False, font={"color": "grey"})  # above the plot, clear of the marks
    figure.update_layout(
        title=f"One DDP step (rank 0), bucket_cap_mb {cap_label(timeline.bucket_cap_mb)}: "
              f"{len(timeline.buckets)} bucket{'s' if len(timeline.buckets) != 1 else ''}",
        xaxis_title="time after loss.backward() was called (ms)", yaxis_title="",
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(["backward: gradients ready", *rows]))},
        height=280 + 26 * len(rows), autosize=True, showlegend=True, legend={"orientation": "h", "y": -0.3},
        margin={"l": 150, "r": 20, "t": 80, "b": 90})
    return figure


def describe(timeline: BucketTimeline) -> str:
    """What the timeline shows, in numbers: order, overlap, and where each bucket starts."""
    buckets, layers = timeline.buckets, layer_names(timeline.param_names)
    launched_early = sum(b.start_s < timeline.compute_end_s for b in buckets)
    order = "in reverse parameter order" if timeline.in_reverse_order() else "NOT in reverse parameter order"
    if len(buckets) == 1:
        holds = f"one bucket, holding {_params_text(buckets[0].params, layers)}"
    else:
        holds = (f"{len(buckets)} buckets {order}: bucket 0 holds {_params_text(buckets[0].params, layers)}, "
                 f"bucket {buckets[-1].index} holds {_params_text(buckets[-1].params, layers)}")
    return (f"{holds}. {launched_early} of {len(buckets)} all-reduce(s) launched before the last gradient was ready "
            f"({timeline.compute_end_s * 1e3:.1f} ms); backward() returned at {timeline.backward_s * 1e3:.1f} ms.")


class BucketTimelineExplorer(w.VBox):
    """A ``bucket_cap_mb`` slider over the rows of ``bucket_cap_sweep``: the chosen cap's
    timeline, what it shows, and the sweep's table."""

    def __init__(self, sweep: list[dict], bucket_cap_mb: float | None = None) -> None:
        self.rows = {cap_label(row["bucket_cap_mb"]): row for row in sweep}
        start = cap_label(bucket_cap_mb) if cap_label(bucket_cap_mb) in self.rows else next(iter(self.rows))
        self.cap = w.SelectionSlider(options=list(self.rows), value=start, description="bucket_cap_mb",
                                     continuous_update=False, layout=w.Layout(width="640px"),
                                     style={"description_width": "8em"})
        self.readout = w.HTML()
        self.pane = PlotlyPane()
        cell = "style='text-align:right; padding: 0 1em'"
        table = "".join(f"<tr><td {cell}>{label}</td><td {cell}>{row['num_buckets']}</td>"
                        f"<td {cell}>{row['median_step_s'] * 1e3:.1f} ms</td></tr>"
                        for label, row in self.rows.items())
        self.table = w.HTML(f"<table><tr><th {cell}>bucket_cap_mb</th><th {cell}>buckets</th><th {cell}>median step</th>"
                            f"</tr>{table}</table>")
        self.cap.observe(self._redraw, "value")
        self._redraw()
        super().__init__([with_readout(self.cap), self.readout, self.pane, self.table])

    def _redraw(self, *_) -> None:
        timeline = self.rows[self.cap.value]["timeline"]
        self.readout.value = f"<p>{describe(timeline)}</p>"
        self.pane.show(timeline_figure(timeline))
