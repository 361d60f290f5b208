"""What a learner sees of every plotly figure on a page, read from plotly.js itself.

``FIGURES_ON_PAGE`` runs in the browser and returns one record per drawn plotly figure: its
title, how many traces have data points, and for each numeric axis its title, type, the range
plotly chose and the extent of the data drawn on it. A figure a cell returned comes back after a
page reload as the PNG that plotly's JupyterLab extension saved with the notebook (hover returns
when the cell runs again); such a picture is recorded as ``static``, drawn once it has loaded. ``figure_problems`` turns those records
into sentences a learner would recognise ("the x axis runs to 10^264 while its data ends at
10^4"): the defects found in module 04 before these checks existed.
"""

from __future__ import annotations

FIGURES_ON_PAGE = """() => [...document.querySelectorAll('.jp-RenderedPlotly')].map(host => {
    const gd = host.matches('.js-plotly-plot') ? host : host.querySelector('.js-plotly-plot');
    const picture = host.querySelector('img.plot-img');
    if (!gd && picture)  // plotly's extension shows a saved figure as its PNG until the cell runs again
        return {drawn: picture.complete && picture.naturalWidth > 0, static: true, title: 'a saved figure'};
    if (!gd) return {drawn: false};
    const full = gd._fullLayout;
    if (!full || !gd._fullData) return {drawn: false};
    const numeric = v => typeof v === 'number' && isFinite(v);
    const axes = {};
    for (const trace of gd._fullData) {
        if (trace.visible !== true) continue;
        // a bar drawn from a base (a timeline) covers base ... base + length on its value axis
        const along = trace.type === 'bar' && trace.base !== undefined && trace.base !== null
            ? (trace.orientation === 'h' ? 'x' : 'y') : null;
        const extent = (letter, values) => {
            if (letter !== along) return Array.from(values);
            const base = i => Array.isArray(trace.base) || ArrayBuffer.isView(trace.base) ? trace.base[i] : trace.base;
            return Array.from(values).flatMap((v, i) => [base(i), base(i) + v]);
        };
        for (const [letter, values] of [['x', trace.x], ['y', trace.y]]) {
            const name = (trace[letter + 'axis'] || letter).replace(/^([xy])(\\d*)$/, '$1axis$2');
            const axis = full[name];
            if (!axis || !values) continue;
            const entry = axes[name] = axes[name] || {type: axis.type, range: axis.range && [...axis.range],
                                                      title: (axis.title && axis.title.text) || '', values: []};
            for (const v of extent(letter, values)) if (numeric(v) && (axis.type !== 'log' || v > 0)) entry.values.push(v);
        }
    }
    const summary = {};
    for (const [name, a] of Object.entries(axes)) {
        const vs = a.type === 'log' ? a.values.map(Math.log10) : a.values;
        summary[name] = {type: a.type, range: a.range, title: a.title, count: vs.length,
                         low: vs.length ? Math.min(...vs) : null, high: vs.length ? Math.max(...vs) : null};
    }
    const withPoints = gd._fullData.filter(t => t.visible === true &&
        ((t.x && t.x.length) || (t.y && t.y.length) || (t.values && t.values.length))).length;
    return {drawn: true, title: (full.title && full.title.text) || '', traces: gd._fullData.length,
            tracesWithPoints: withPoints, axes: summary,
            marks: gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .heatmaplayer .hm').length};
})"""

LOG_DECADES_ALLOWED = 2
"""How far past its data a log axis may run, in decades (the roofline pads a factor of 4 each side)."""


def figure_problems(figure: dict) -> list[str]:
    """What is wrong with one record of ``FIGURES_ON_PAGE``, in words (empty when it reads right)."""
    if not figure.get("drawn"):
        return ["a plotly figure was never drawn (no layout or data)"]
    if figure.get("static"):
        return []  # a picture plotly.js drew and saved: nothing left to read off it
    name = repr(figure["title"][:80]) if figure["title"] else "a figure without a title"
    problems = [] if figure["title"] else ["a figure has no title"]
    if not figure["tracesWithPoints"] or not figure["marks"]:
        problems.append(f"{name} shows no data ({figure['traces']} traces, {figure['marks']} drawn)")
    for axis_name, axis in figure["axes"].items():
        if axis["type"] not in ("linear", "log") or not axis["count"] or not axis["range"]:
            continue
        if not axis["title"]:
            problems.append(f"{name}: its {axis_name} has no title")
        low, high = axis["low"], axis["high"]
        start, end = sorted(axis["range"])
        if axis["type"] == "log":
            if start < low - LOG_DECADES_ALLOWED or end > high + LOG_DECADES_ALLOWED:
                problems.append(f"{name}: the log {axis_name} runs 10^{start:.1f} to 10^{end:.1f} while its data "
                                f"spans 10^{low:.1f} to 10^{high:.1f}")
        else:
            low, high = min(low, 0.0), max(high, 0.0)  # an axis may start at zero
            span = (high - low) or abs(high) or 1.0
            if start < low - span or end > high + span:
                problems.append(f"{name}: the {axis_name} runs {start:.3g} to {end:.3g} while its data spans "
                                f"{axis['low']:.3g} to {axis['high']:.3g}")
    return problems
