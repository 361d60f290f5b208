"""Module 09: the accuracy gate's result as a learner reads it, a table and a chart.

``gate_table_html``: one row per scheme (the baseline first), the loss columns and the behaviour
columns with a legend, as an HTML table that never wraps a row. ``plot_gate_buckets``: one panel
per breakdown, for every scheme the increase in bits/byte over the full-precision baseline in each
bucket (position within the window) and in each non-empty section of the held-out text, with the
gate's threshold for that breakdown drawn across, or named in the corner when it is far above every
bar. Every number is one of the ``GateResult``'s; nothing is recomputed here.
"""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np

from course_lib.quant.gate import SECTIONS, GateResult, table_rows

OFF_CHART = 3  # a threshold more than this many times the tallest bar is named, not drawn


def _bars(ax, labels: list[str], result: GateResult, values_of, threshold: float, title: str, xlabel: str) -> None:
    width = 0.8 / max(1, len(result.schemes))
    x = np.arange(len(labels))
    for i, scheme in enumerate(result.schemes):
        values = [values_of(scheme, label) for label in labels]
        ax.bar(x + (i - (len(result.schemes) - 1) / 2) * width, values, width, label=scheme.scheme)
    tallest = max((abs(values_of(s, label)) for s in result.schemes for label in labels), default=0.0)
    if threshold <= OFF_CHART * tallest:
        ax.axhline(threshold, color="black", linestyle="--", linewidth=1.2, label=f"gate limit ({threshold:g})")
    else:
        ax.text(0.01, 0.97, f"gate limit: +{threshold:g} bits/byte, {threshold / tallest:.0f}x the tallest bar "
                "(off the chart)" if tallest else f"gate limit: +{threshold:g} bits/byte",
                transform=ax.transAxes, va="top", fontsize="small")
        ax.set_ylim(top=1.35 * tallest if tallest else threshold)
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


def _cell(text: str, bold: bool = False) -> str:
    style = "padding:2px 8px;text-align:right;white-space:nowrap" + (";font-weight:bold" if bold else "")
    return f"<td style='{style}'>{html.escape(text)}</td>"


def gate_table_html(result: GateResult) -> str:
    """The gate's table (``gate.table_rows``) as HTML, with a legend under it."""
    head, rows = table_rows(result)
    header = "".join(f"<th style='padding:2px 8px;white-space:nowrap'>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(_cell(c, bold=(i == len(r) - 1)) for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    t, settings = result.thresholds, result.settings
    legend = (f"<p style='font-size:90%'><b>bpb</b>: bits per byte. <b>d</b> columns: bits/byte above the float32 model (its own value in "
              f"parentheses), overall, by position of the predicted token in its {settings['window']}-token "
              "window, and by section of the text. <b>agree</b>: mean share of greedy tokens equal to the "
              "baseline's before the first difference; <b>ident</b> (identical): share of continuations equal token for "
              "token; <b>struct</b> (structure kept): share of the code lines the baseline balances that the scheme "
              f"balances too. Limits: +{t['max_bpb_increase']} overall, +{t['max_bpb_increase_bucket']} per "
              f"bucket, +{t['max_bpb_increase_section']} per section, agreement at least {t['min_agreement']}, "
              f"structure kept at least {t['min_structure_kept']}. {settings['windows']} windows, "
              f"{settings['continuations']} continuations, {settings['code_lines']} code lines.</p>")
    return (f"<div style='overflow-x:auto'><table style='border-collapse:collapse;font-size:90%'>"
            f"<tr>{header}</tr>{body}</table></div>{legend}")
