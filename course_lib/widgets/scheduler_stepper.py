"""Step through a real engine run: the queues, each step's token split and the KV blocks.

The engine runs to completion first while ``record_run`` snapshots its state after every
step; the widget then replays the snapshots, so moving backwards is as cheap as forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

import ipywidgets as w

from course_lib.engine.llm import LLM
from course_lib.engine.metrics import StepRecord

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]


@dataclass(frozen=True)
class RequestState:
    computed: int  # tokens whose KV is in the cache
    prompt_len: int
    num_outputs: int


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine right after one step. ``blocks`` maps each request to its block ids;
    ``cached_free`` are free blocks that still hold a cached prefix (reusable until evicted)."""

    record: StepRecord
    requests: dict[str, RequestState]
    blocks: dict[str, list[int]]
    cached_free: frozenset[int]
    finished: tuple[str, ...]


def record_run(llm: LLM) -> list[EngineSnapshot]:
    """Run ``llm`` until its queues are empty, snapshotting after every step."""
    snapshots = []
    pool = llm.kv_cache_manager.block_pool
    while llm.scheduler.has_unfinished_requests():
        finished = llm.step()
        live = llm.scheduler.requests
        snapshots.append(EngineSnapshot(
            record=llm.step_trace[-1],
            requests={rid: RequestState(r.num_computed_tokens, len(r.prompt_token_ids), len(r.output_token_ids))
                      for rid, r in live.items()},
            blocks={rid: llm.kv_cache_manager.block_ids(rid) for rid in live},
            cached_free=frozenset(b.block_id for b in pool.free_block_queue if b.block_hash is not None),
            finished=tuple(r.request_id for r in finished)))
    return snapshots


def _colour(request_id: str, order: list[str]) -> str:
    return PALETTE[order.index(request_id) % len(PALETTE)]


def _chip(request_id: str, order: list[str], text: str) -> str:
    return (f"<span style='display:inline-block;margin:2px;padding:2px 6px;border-radius:4px;color:white;"
            f"background:{_colour(request_id, order)}'>{escape(request_id)} {escape(text)}</span>")


def _kind(snapshot: EngineSnapshot, request_id: str, num_tokens: int) -> str:
    """'prefill' when the step computed prompt tokens, else 'decode'."""
    state = snapshot.requests.get(request_id)
    if state is None:  # finished in this step
        return "decode" if num_tokens == 1 else "prefill"
    return "prefill" if state.computed - num_tokens < state.prompt_len else "decode"


def render_snapshot(snapshot: EngineSnapshot, num_blocks: int, budget: int, order: list[str]) -> str:
    """HTML for one step: the token split, both queues and the block map."""
    record = snapshot.record
    split = ", ".join(f"<b>{escape(rid)}</b>: {n} ({_kind(snapshot, rid, n)})" for rid, n in record.scheduled.items())
    lines = [f"<b>Step {record.step}</b>: {{{split}}} = {record.num_tokens} of {budget} budget tokens"]
    if record.preempted:
        lines.append(f"<span style='color:#c00'>preempted: {', '.join(map(escape, record.preempted))}</span>")
    if snapshot.finished:
        lines.append(f"finished: {', '.join(map(escape, snapshot.finished))}")
    if record.prefix_hit_tokens:
        lines.append(f"prefix-cache hits: {record.prefix_hit_tokens} tokens")

    def describe(rid: str) -> str:
        state = snapshot.requests[rid]
        if state.computed < state.prompt_len:
            return f"prefill {state.computed}/{state.prompt_len}"
        return f"decoding, {state.num_outputs} out"

    waiting = "".join(_chip(rid, order, describe(rid)) for rid in record.waiting) or "<i>empty</i>"
    running = "".join(_chip(rid, order, describe(rid)) for rid in record.running) or "<i>empty</i>"
    owner = {block: rid for rid, blocks in snapshot.blocks.items() for block in blocks}
    cells = []
    for block in range(num_blocks):
        if block in owner:
            style, label = f"background:{_colour(owner[block], order)};color:white", owner[block]
        elif block in snapshot.cached_free:
            style, label = "background:#ddd;color:#555", "cached"
        else:
            style, label = "background:white;color:#aaa", ""
        cells.append(f"<div title='block {block}' style='width:44px;height:34px;border:1px solid #999;{style};"
                     f"font-size:10px;text-align:center;overflow:hidden'>{block}<br>{escape(label)}</div>")
    return (f"<div style='font-family:sans-serif;font-size:13px'>{'<br>'.join(lines)}"
            f"<p><b>waiting</b> (front first): {waiting}</p><p><b>running</b>: {running}</p>"
            f"<p><b>KV blocks</b> (grey: free but still cached; white: free)</p>"
            f"<div style='display:flex;flex-wrap:wrap;gap:2px;max-width:640px'>{''.join(cells)}</div></div>")


def scheduler_stepper(snapshots: list[EngineSnapshot], num_blocks: int, budget: int) -> w.VBox:
    """Slider, play button and previous/next buttons over recorded snapshots."""
    if not snapshots:
        raise ValueError("No steps recorded: add requests to the engine before calling record_run.")
    order = []
    for snapshot in snapshots:
        for rid in [*snapshot.record.waiting, *snapshot.record.running, *snapshot.record.scheduled]:
            if rid not in order:
                order.append(rid)
    slider = w.IntSlider(0, 0, len(snapshots) - 1, description="step", continuous_update=True)
    play = w.Play(value=0, min=0, max=len(snapshots) - 1, interval=700, description="play")
    w.jslink((play, "value"), (slider, "value"))
    back, forward = w.Button(description="◀ previous"), w.Button(description="next ▶")
    view = w.HTML(render_snapshot(snapshots[0], num_blocks, budget, order))

    def show(change=None) -> None:
        view.value = render_snapshot(snapshots[slider.value], num_blocks, budget, order)

    back.on_click(lambda _: setattr(slider, "value", max(0, slider.value - 1)))
    forward.on_click(lambda _: setattr(slider, "value", min(slider.max, slider.value + 1)))
    slider.observe(show, names="value")
    return w.VBox([w.HBox([play, back, forward, slider]), view])
