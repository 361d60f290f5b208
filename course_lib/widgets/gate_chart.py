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

from course_lib.quant.gate import GateResult, breakdown, table_rows

OFF_CHART = 3  # a threshold more than this many times the tallest bar is named, not drawn


def _bars(ax, labels: list[str], result: GateResult, values_of, threshold: float, tallest: float, title: str,
          xlabel: str) -> None:
    """One group of bars per label; the gate's ``threshold`` drawn across, or named in the corner when
    it is more than ``OFF_CHART`` times ``tallest``, the tallest bar of the whole figure."""
    width = 0.8 / max(1, len(result.schemes))
    x = np.arange(len(labels))
    for i, scheme in enumerate(result.schemes):
        values = [values_of(scheme, label) for label in labels]
        ax.bar(x + (i - (len(result.schemes) - 1) / 2) * width, values, width, label=scheme.scheme)
    if threshold <= OFF_CHART * tallest:
        ax.axhline(threshold, color="black", linestyle="--", linewidth=1.2, label=f"gate limit ({threshold:g})")
    else:
        ax.text(0.01, 0.97, f"gate limit: +{threshold:g} bits/byte, {threshold / tallest:.0f}x the tallest bar "
                "(off the chart)" if tallest else f"gate limit: +{threshold:g} bits/byte",
                transform=ax.transAxes, va="top", fontsize="small")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, labels)
    ax.set(title=title, xlabel=xlabel, ylabel="bits/byte above the float32 model")


def plot_gate_buckets(result: GateResult):
    """Two panels on one y scale: the increase per context-length bucket, and per section of the text.
    Each panel's limit is drawn, or named, by the same rule against the figure's tallest bar, so the two
    read alike."""
    if not result.schemes:
        raise ValueError("The gate result holds no scheme; run evaluate with at least one scheme.")
    buckets, sections = breakdown(result)
    by_bucket_of, by_section_of = (lambda s, b: s.delta["buckets"][b]), (lambda s, x: s.delta["sections"][x])
    tallest = max([abs(by_bucket_of(s, b)) for s in result.schemes for b in buckets]
                  + [abs(by_section_of(s, x)) for s in result.schemes for x in sections], default=0.0)
    limits = (result.thresholds["max_bpb_increase_bucket"], result.thresholds["max_bpb_increase_section"])
    fig, (by_bucket, by_section) = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
    _bars(by_bucket, buckets, result, by_bucket_of, limits[0], tallest, "Loss increase by context length",
          f"position of the predicted token in its {result.settings['window']}-token window")
    _bars(by_section, sections, result, by_section_of, limits[1], tallest,
          "Loss increase by section of the text (the task mix)", "section of the held-out text")
    drawn = [limit for limit in limits if limit <= OFF_CHART * tallest]
    top = max([1.35 * tallest, *(1.1 * limit for limit in drawn)]) if tallest else max(limits)
    by_bucket.set_ylim(top=top)  # shared: both panels
    by_section.yaxis.set_tick_params(labelleft=True)
    by_bucket.legend(fontsize="small")
    fig.tight_layout()
    return fig


NUMBER_CELL = "padding:2px 5px;text-align:right;white-space:nowrap"
VERDICT_CELL = "padding:2px 5px;text-align:left;font-weight:bold;min-width:4em"  # a FAIL's reasons wrap


def _header(result: GateResult) -> str:
    """Two header rows: the loss increases under one heading (overall, by position, by section), so
    each column's own label stays short; the other columns span both rows."""
    buckets, sections = breakdown(result)
    deltas = ["overall", *(f"pos {b}" for b in buckets), *sections]

    def th(text: str, span: str = "") -> str:
        return f"<th style='padding:2px 5px'{span}>{html.escape(text)}</th>"

    tall = " rowspan='2'"
    first = (th("scheme", tall) + th("bpb", tall) + th("bits/byte above the float32 model", f" colspan='{len(deltas)}'")
             + "".join(th(name, tall) for name in ("agree", "ident", "struct", "verdict")))
    return f"<tr>{first}</tr><tr>{''.join(th(name) for name in deltas)}</tr>"


def gate_table_html(result: GateResult) -> str:
    """The gate's table (``gate.table_rows``) as HTML, narrow enough for a notebook's output area, with a
    legend under it. Numbers never wrap; a FAIL verdict's list of failed checks may."""
    _, rows = table_rows(result)
    body = "".join("<tr>" + "".join(f"<td style='{VERDICT_CELL if i == len(r) - 1 else NUMBER_CELL}'>"
                                    f"{html.escape(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    t, settings = result.thresholds, result.settings
    legend = (f"<p style='font-size:90%'><b>bpb</b>: bits per byte. Under <b>bits/byte above the float32 model</b> "
              "(the model's own value in parentheses): overall, by position (<b>pos</b>) of the predicted token in "
              f"its {settings['window']}-token window, and by section of the text. <b>agree</b>: mean share of greedy "
              "tokens equal to the baseline's before the first difference; <b>ident</b> (identical): share of "
              "continuations equal token for token; <b>struct</b> (structure kept): share of the code lines the "
              f"baseline balances that the scheme balances too. Limits: +{t['max_bpb_increase']} overall, "
              f"+{t['max_bpb_increase_bucket']} per position bucket, +{t['max_bpb_increase_section']} per section, "
              f"agreement at least {t['min_agreement']}, structure kept at least {t['min_structure_kept']}. "
              f"{settings['windows']} windows, {settings['continuations']} continuations, "
              f"{settings['code_lines']} code lines.</p>")
    return (f"<div style='overflow-x:auto'><table style='border-collapse:collapse;font-size:90%'>"
            f"{_header(result)}{body}</table></div>{legend}")
