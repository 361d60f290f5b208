"""Step through a real ring all-reduce: every rank's chunks after each step, and who sent what.

``record_ring(N)`` runs ``ring_all_reduce`` on N real ranks where rank r holds 2**r in every
chunk, so a chunk's value is a bit mask of the ranks whose data it contains.
"""

from __future__ import annotations

import ipywidgets as w
import torch
import torch.distributed as dist

from course_lib.collectives.launch import run_on_ranks
from course_lib.collectives.ring import ring_all_reduce
from course_lib.collectives.trace import CommTrace
from course_lib.widgets.rank_view import RANK_COLOURS

COMPLETE_SUM_COLOUR = "#222222"
"""Near-black: unlike every rank's own colour (``RANK_COLOURS``) and the grey of a partial sum."""
PARTIAL_SUM_COLOUR = "#8c8c8c"


def _ring_on_this_rank() -> CommTrace:
    world = dist.get_world_size()
    data = torch.full((world,), float(2 ** dist.get_rank()))  # one element per chunk
    return ring_all_reduce(data, record_values=True)


def record_ring(world_size: int = 4) -> list[CommTrace]:
    """Each rank's trace of one ring all-reduce with one value per chunk (world_size <= 8)."""
    if not 2 <= world_size <= 8:
        raise ValueError(f"world_size must be between 2 and 8 for the stepper, got {world_size}.")
    return run_on_ranks(_ring_on_this_rank, world_size)


def ring_frames(traces: list[CommTrace]) -> list[dict]:
    """One frame per step (plus the start): each rank's chunk masks and the sends that led there."""
    world = len(traces)
    frames = [{"title": "start: rank r holds only its own data", "masks": [[2**r] * world for r in range(world)],
               "sends": []}]
    for index, (phase, step, _) in enumerate(traces[0].buffers):
        frames.append({
            "title": f"{phase}, step {step + 1} of {world - 1}",
            "masks": [[int(v) for v in trace.buffers[index][2]] for trace in traces],
            "sends": [(t.src, t.dst, t.chunk) for trace in traces for t in trace.transfers[index:index + 1]],
        })
    return frames


def render_frame(frame: dict, world: int) -> str:
    """HTML: a row of chunks per rank; each chunk lists the ranks summed into it."""
    sent = {(src, chunk) for src, _, chunk in frame["sends"]}
    received = {(dst, chunk) for _, dst, chunk in frame["sends"]}
    rows = []
    for rank, masks in enumerate(frame["masks"]):
        cells = []
        for chunk, mask in enumerate(masks):
            members = [r for r in range(world) if mask >> r & 1]
            complete = len(members) == world
            colour = COMPLETE_SUM_COLOUR if complete else RANK_COLOURS[members[0] % len(RANK_COLOURS)] \
                if len(members) == 1 else PARTIAL_SUM_COLOUR
            border = "3px solid #d62728" if (rank, chunk) in received else "1px solid #444"
            label = "<b>all</b>" if complete else "+".join(f"r{m}" for m in members)
            arrow = " &#8599;" if (rank, chunk) in sent else ""
            cells.append(f"<td style='background:{colour};color:white;border:{border};padding:4px 8px;"
                         f"text-align:center;min-width:60px'>chunk {chunk}<br>{label}{arrow}</td>")
        rows.append(f"<tr><td><b>rank {rank}</b></td>{''.join(cells)}</tr>")
    sends = ", ".join(f"r{src}&rarr;r{dst}: chunk {chunk}" for src, dst, chunk in frame["sends"]) or "none yet"
    return (f"<div style='font-family:sans-serif;font-size:13px'><b>{frame['title']}</b><br>sends this step: {sends}"
            f"<table style='border-collapse:separate;border-spacing:3px'>{''.join(rows)}</table>"
            f"<small>label: ranks whose data the chunk holds; own colour: a rank's own data only; grey: a partial "
            f"sum; black, <b>all</b>: the complete sum; red border: just received; &#8599;: just sent</small></div>")


def ring_stepper(traces: list[CommTrace]) -> w.VBox:
    """Previous/next buttons and a slider over the frames of a recorded ring all-reduce."""
    frames, world = ring_frames(traces), len(traces)
    slider = w.IntSlider(0, 0, len(frames) - 1, description="step")
    back, forward = w.Button(description="◀ previous"), w.Button(description="next ▶")
    view = w.HTML(render_frame(frames[0], world))
    slider.observe(lambda _: setattr(view, "value", render_frame(frames[slider.value], world)), "value")
    back.on_click(lambda _: setattr(slider, "value", max(0, slider.value - 1)))
    forward.on_click(lambda _: setattr(slider, "value", min(slider.max, slider.value + 1)))
    return w.VBox([w.HBox([back, forward, slider]), view])
