"""Module 09: the accuracy gate's loss increases drawn per context-length bucket and per section.

One panel per breakdown of ``course_lib.quant.gate.evaluate``'s result: for every scheme, the
increase in bits/byte over the full-precision baseline in each bucket (position within the
window) and in each non-empty section of the held-out text, with the gate's threshold for that
breakdown drawn across. Every bar is a number of the ``GateResult``; nothing is recomputed here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from course_lib.quant.gate import SECTIONS, GateResult


def _bars(ax, labels: list[str], result: GateResult, values_of, threshold: float, title: str, xlabel: str) -> None:
    width = 0.8 / max(1, len(result.schemes))
    x = np.arange(len(labels))
    for i, scheme in enumerate(result.schemes):
        values = [values_of(scheme, label) for label in labels]
        ax.bar(x + (i - (len(result.schemes) - 1) / 2) * width, values, width, label=scheme.scheme)
    ax.axhline(threshold, color="black", linestyle="--", linewidth=1.2, label=f"gate limit ({threshold:g})")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, labels)
    ax.set(title=title, xlabel=xlabel, ylabel="bits/byte above the float32 model")


def plot_gate_buckets(result: GateResult):
    """Two panels: the increase per context-length bucket, and per section of the text."""
    if not result.schemes:
        raise ValueError("The gate result holds no scheme; run evaluate with at least one scheme.")
    base = result.baseline["bits_per_byte"]
    buckets = list(base["buckets"])
    sections = [s for s in SECTIONS if base["sections"][s]["tokens"]]
    fig, (by_bucket, by_section) = plt.subplots(1, 2, figsize=(12, 3.8))
    _bars(by_bucket, buckets, result, lambda s, b: s.delta["buckets"][b],
          result.thresholds["max_bpb_increase_bucket"], "Loss increase by context length",
          f"position of the predicted token in its {result.settings['window']}-token window")
    _bars(by_section, sections, result, lambda s, x: s.delta["sections"][x],
          result.thresholds["max_bpb_increase_section"], "Loss increase by section of the text (the task mix)",
          "section of the held-out text")
    by_bucket.legend(fontsize="small")
    fig.tight_layout()
    return fig
