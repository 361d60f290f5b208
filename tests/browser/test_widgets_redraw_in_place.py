"""After Run All, a widget's preset redraws its own picture, and nothing strays into the log console.

In JupyterLab a widget's callbacks may run on another kernel thread, or while other cells run;
a figure shown through an Output widget could then land in JupyterLab's log console, or not
at all. The widgets' pictures are PNG images set as widget state (``FigurePane``): choosing a
preset must swap the image inside the widget, and the log console (which shows, at its default
"warning" level, the outputs that no cell took) must stay empty. Plotly figures are widget state
too (``PlotlyPane``, an Output widget whose outputs are set, never captured): the same must hold
for them.
"""

from __future__ import annotations

import pytest

PRESETS = [  # lesson, the preset dropdown's label, the choice, text the widget shows afterwards
    ("01_paging.ipynb", "preset", "Llama-3.1-70B", "80 layers"),
]
PLOTLY_PRESETS = [  # lesson, the dropdown's label, text in the plot's title before, the choice, text in it after
    ("04_roofline.ipynb", "GPU", "H100-80GB", "L4-24GB", "L4-24GB"),
    ("06_ring_vs_tree.ipynb", "link preset", "α = 5 µs", "NVLink 4 (H100, within a node)", "α = 1 µs, 450 GB/s"),
]


def _log_console_entries(page) -> list[str]:
    """Open View > Show Log Console at the "warning" level; each entry as "mime type: text"."""
    page.click("li.lm-MenuBar-item:has-text('View')")
    page.click("li.lm-Menu-item:has-text('Show Log Console')")
    level = page.locator(".jp-LogConsole select[aria-label='Log level']")
    level.wait_for(timeout=10_000)
    level.select_option("warning")
    page.wait_for_timeout(500)
    return page.locator(".jp-LogConsolePanel .jp-OutputArea-child .jp-OutputArea-output").evaluate_all(
        "outputs => outputs.map(o => `${o.dataset.mimeType}: ${o.innerText.slice(0, 1000)}`)")


@pytest.mark.parametrize("lesson, label, choice, shown", PRESETS, ids=[p[0].removesuffix(".ipynb") for p in PRESETS])
def test_a_preset_redraws_its_widget_in_place_after_run_all(open_lesson, lesson, label, choice, shown):
    page = open_lesson(lesson)
    dropdown = f".widget-dropdown:has(> label:text-is('{label}'))"
    output = page.locator(".jp-OutputArea-output", has=page.locator(dropdown))
    assert output.count() == 1, f"{lesson}: expected one widget with a '{label}' dropdown"
    picture = output.locator("img")
    assert picture.count() == 1, f"{lesson}: the widget should hold one picture"
    picture.scroll_into_view_if_needed()
    before = picture.get_attribute("src")
    output.locator(f"{dropdown} select").select_option(label=choice)
    page.wait_for_function("([img, old]) => img.src !== old && img.complete && img.naturalWidth > 0",
                           arg=[picture.element_handle(), before], timeout=20_000)
    page.wait_for_function("([el, text]) => el.textContent.includes(text)",
                           arg=[output.element_handle(), shown], timeout=10_000)
    page.wait_for_timeout(1500)  # time for any stray output to arrive
    assert output.locator("img").count() == 1, f"{lesson}: the redraw was added beside the old picture"
    strays = _log_console_entries(page)
    assert not strays, f"{lesson}: {len(strays)} output(s) went to the log console: {strays}"


@pytest.mark.parametrize("lesson, label, before, choice, after", PLOTLY_PRESETS,
                         ids=[p[0].removesuffix(".ipynb") for p in PLOTLY_PRESETS])
def test_a_plotly_figure_redraws_inside_its_widget_after_run_all(open_lesson, lesson, label, before, choice, after):
    """Module 04's roofline explorer and module 06's crossover explorer draw through ``PlotlyPane``:
    choosing a preset must redraw the same plot (its title follows the choice),
    add no second plot, and send nothing astray."""
    page = open_lesson(lesson)
    dropdown = f".widget-dropdown:has(> label:text-is('{label}'))"
    output = page.locator(".jp-OutputArea-output", has=page.locator(dropdown)).first
    plot = output.locator(".js-plotly-plot")
    plot.first.wait_for(timeout=20_000)
    assert plot.count() == 1, f"{lesson}: the widget should hold one plotly figure"
    assert before in plot.locator(".gtitle").text_content()
    output.locator(f"{dropdown} select").first.select_option(label=choice)
    page.wait_for_function(  # the pane replaces its plot: look it up again each time
        "([el, text]) => { const title = el.querySelector('.js-plotly-plot .gtitle');"
        " return title && title.textContent.includes(text); }", arg=[output.element_handle(), after], timeout=20_000)
    page.wait_for_timeout(1500)
    assert plot.count() == 1, f"{lesson}: the redraw was added beside the old figure"
    strays = _log_console_entries(page)
    assert not strays, f"{lesson}: {len(strays)} output(s) went to the log console: {strays}"
