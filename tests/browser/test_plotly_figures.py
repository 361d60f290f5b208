"""Figures that a cell returns as a plotly ``go.Figure`` (not a widget) render in JupyterLab after
Run All, with their titles, and hovering a point shows its value with its unit.

Such a figure goes out as plotly's own MIME type, drawn by the plotly extension that ships with
the ``plotly`` package; without it JupyterLab would show nothing, or a text repr, where the
lesson says "hover over a point".
"""

from __future__ import annotations

import re

import pytest

FIGURES = [  # lesson, the start of each figure's title, text that hovering the first figure's first point shows
    ("02_batching.ipynb", ["Continuous over static batching"], "throughput 1.00x"),  # spread 0: no gain
    ("03_scheduler.ipynb", ["The token budget", "Llama-3.1-8B on the L4-24GB"], " ms"),
]


def hover(page, plot, where: str, tries: int = 5) -> None:
    """Send the mouse events of a pointer resting on the page position [x, y] that the JavaScript
    ``where`` (given the plot) returns, until plotly shows a hover label. The events go to the
    plot's drag layer (where plotly listens; the points themselves take no events), so the point
    need not be scrolled on screen; a plot may still be redrawing after Run All, so
    the position is read again on each try."""
    send = ("el => { const [x, y] = (" + where + ")(el); const drag = el.querySelector('.nsewdrag');"
            " for (const type of ['mouseover', 'mousemove']) drag.dispatchEvent(new MouseEvent(type,"
            " {clientX: x, clientY: y, bubbles: true})); return [x, y]; }")
    for _ in range(tries):
        page.wait_for_timeout(700)
        x, y = plot.evaluate(send)
        for _ in range(10):
            page.wait_for_timeout(300)
            if plot.locator(".hoverlayer .hovertext").count():
                return
    raise AssertionError(f"plotly showed no hover label for a pointer at ({x:.0f}, {y:.0f})")


FIRST_POINT = """el => {  // the centre of the plot's first marker, in page pixels
    const box = el.querySelector(".scatterlayer .point").getBoundingClientRect();
    return [box.x + box.width / 2, box.y + box.height / 2];
}"""


@pytest.mark.parametrize("lesson, titles, unit", FIGURES, ids=[f[0].removesuffix(".ipynb") for f in FIGURES])
def test_returned_plotly_figures_render_and_answer_hover(open_lesson, lesson, titles, unit):
    page = open_lesson(lesson)
    plots = page.locator(".jp-OutputArea-output.jp-RenderedPlotly")  # plotly's renderer, not a widget
    shown = [plots.nth(i).locator(".gtitle").text_content() for i in range(plots.count())]
    found = [next((t for t in shown if t.startswith(title)), None) for title in titles]
    assert all(found), f"{lesson}: expected figures titled {titles}, found {shown}"
    first = plots.filter(has_text=titles[0]).first
    first.scroll_into_view_if_needed()
    hover(page, first, FIRST_POINT)
    label = first.locator(".hoverlayer .hovertext").first.text_content()
    assert unit in label, f"{lesson}: hovering the first point of {titles[0]!r} showed {label!r}"


POINT_ON_SCREEN = """gd => {  // where the first trace's 41st point (of 200) is drawn, in page pixels
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
    const trace = gd._fullData[0];
    return [box.left + xa._offset + xa.c2p(trace.x[40]), box.top + ya._offset + ya.c2p(trace.y[40])];
}"""


def test_crossover_hover_gives_the_size_and_every_algorithms_time(open_lesson):
    """Module 06's crossover explorer: hovering the ring's curve names the message size and the
    time of the ring and of both trees, each in the unit that fits it (µs, ms or s), so the crossover
    can be read off any point."""
    page = open_lesson("06_ring_vs_tree.ipynb")
    plot = page.locator(".jp-OutputArea-output .js-plotly-plot").filter(has_text="All-reduce on 512 ranks").first
    plot.scroll_into_view_if_needed()
    hover(page, plot, POINT_ON_SCREEN)
    label = plot.locator(".hoverlayer .hovertext").first.text_content()
    assert label.startswith("ring, message ") and "KiB" in label, label
    for name in ("ring", "binary tree", "double binary tree"):
        assert re.search(rf"{name}: [\d.,]+ (µs|ms|s)", label), f"hover should give every algorithm's time: {label!r}"
