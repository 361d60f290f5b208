"""Module 04's design checklist: "serve this model for real-time chat with tight p99 TTFT and ITL".

The learner ticks the moves they would make; "Check my design" then says, for every move,
whether it belongs in a low-latency design and why, ticked or not (with nothing ticked it asks
for a choice first, so the key is never shown for an empty design). Nothing is scored: it is
a rubric to think with, and its reasons are the lesson's argument in short.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as w

from course_lib.perf.units import plural


@dataclass(frozen=True)
class DesignMove:
    text: str
    belongs: bool
    why: str


MOVES = (
    DesignMove("Name TTFT and ITL as two separate targets before choosing anything", True,
               "TTFT is set by prefill (compute-bound), ITL by decode (bandwidth-bound); they pull in opposite "
               "directions, and a single latency number hides the trade."),
    DesignMove("Pick max_num_batched_tokens from the ITL target", True,
               "It is the first dial: a smaller token budget means smaller prefill chunks in each step, so "
               "decodes are stalled less (better ITL); a larger one finishes prompts sooner (better TTFT)."),
    DesignMove("Raise max_num_seqs as far as memory allows, to serve everyone at once", False,
               "More sequences per step make every step longer (worse ITL) and, past what the KV cache holds, "
               "they preempt each other. Size it from the cache and the ITL target."),
    DesignMove("Split prefill and decode onto separate instances if long prompts spike tail ITL", True,
               "Disaggregation keeps prefill bursts out of ongoing decodes and lets each pool have its own "
               "parallelism; the price is moving every prompt's KV between them."),
    DesignMove("Split prefill and decode to get more throughput from the same GPUs", False,
               "Disaggregation is a latency lever. Under a load that saturates them, the same GPUs do the same "
               "work plus KV transfers, and whichever pool is not the bottleneck sits partly idle, so they serve "
               "no more (section 4's saturated run serves fewer tokens per second split). A workload that does not "
               "saturate them can finish sooner split, but through shorter decode gaps: a latency gain."),
    DesignMove("Add speculative decoding while the decode batch is small (low to medium QPS)", True,
               "In the bandwidth-bound regime the target verifies k drafts in one pass for nearly the price "
               "of one token, so accepted drafts cut ITL, losslessly."),
    DesignMove("Turn speculative decoding on at peak load to absorb the traffic", False,
               "At high QPS the batch is near the compute roof: drafts cost 1 + k tokens each and rejected "
               "ones are wasted work, so speculation can make things slower."),
    DesignMove("Enable prefix caching for the shared system prompt and earlier turns", True,
               "Hits skip prefill work, which lowers TTFT; with no shared prefixes it costs little."),
)


def review(chosen: set[int], moves: tuple[DesignMove, ...] = MOVES) -> tuple[list[str], str]:
    """Per move, a line saying whether choosing it (or not) was right and why; and a summary."""
    lines, right = [], 0
    for index, move in enumerate(moves):
        ticked = index in chosen
        ok = ticked == move.belongs
        right += ok
        verdict = ("belongs in the design" if move.belongs else "does not belong") + (
            "; you chose it" if ticked else "; you left it out")
        lines.append(f"{'✔' if ok else '✘'} {move.text}: {verdict}. {move.why}")
    picked_wrong = sum(index in chosen and not move.belongs for index, move in enumerate(moves))
    missed = sum(index not in chosen and move.belongs for index, move in enumerate(moves))
    summary = (f"{right} of {len(moves)} decided as a strong design would; "
               f"{plural(missed, 'good move')} left out, {plural(picked_wrong, 'pitfall')} chosen.")
    return lines, summary


class DesignChecklist(w.VBox):
    """A checkbox per design move and a button that explains every one of them."""

    def __init__(self, moves: tuple[DesignMove, ...] = MOVES) -> None:
        self.moves = moves
        self.boxes = [w.Checkbox(False, description=move.text, indent=False, layout=w.Layout(width="auto"))
                      for move in moves]
        self.button = w.Button(description="Check my design", button_style="primary")
        self.feedback = w.HTML()
        self.button.on_click(self._check)
        super().__init__([w.HTML("<b>Real-time chat with tight p99 TTFT and ITL: which moves would you make?</b>"),
                          *self.boxes, self.button, self.feedback])

    def _check(self, _button=None) -> None:
        """Explain every move, once at least one is ticked: an empty design would only reveal the key."""
        chosen = {i for i, box in enumerate(self.boxes) if box.value}
        if not chosen:
            self.feedback.value = "<p><b>Tick the moves you would make first (at least one); then check.</b></p>"
            return
        lines, summary = review(chosen, self.moves)
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        self.feedback.value = f"<p><b>{html.escape(summary)}</b></p><ul>{items}</ul>"
