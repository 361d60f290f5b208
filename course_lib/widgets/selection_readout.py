"""Selection sliders with a readout that cannot be typed into.

ipywidgets draws a ``SelectionSlider``'s readout as editable text, yet ignores what is typed there
(only numeric sliders read it back), so a learner who types a value sees it accepted and nothing
change. ``with_readout`` turns that readout off and shows the chosen option's label as plain text
beside the slider instead; the slider itself stays the control the widget observes and sets.
"""

from __future__ import annotations

import ipywidgets as w

SELECTION_SLIDERS = (w.SelectionSlider, w.SelectionRangeSlider)
READOUT_MARGIN = "0 0 0 16px"
"""Space before the label: more than half a slider handle (ipywidgets' handle is about 16 px wide)."""


def with_readout(control: w.Widget) -> w.Widget:
    """``control`` as it is displayed: a selection slider in a row with a plain-text label that always
    shows its chosen option (its own editable readout off); any other control unchanged."""
    if not isinstance(control, SELECTION_SLIDERS):
        return control
    control.readout = False
    # The handle at the slider's end reaches past its track: the margin keeps it off the label's text.
    readout = w.Label(layout=w.Layout(min_width="5em", margin=READOUT_MARGIN))

    def show(_=None) -> None:
        # From the index, not ``control.label``: ipywidgets leaves the label empty when a slider is
        # built with the value of its first option.
        labels = control._options_labels
        ends = control.index if isinstance(control, w.SelectionRangeSlider) else (control.index,)
        readout.value = " – ".join(labels[i] for i in ends)

    show()
    control.observe(show, ["index", "options"])
    return w.HBox([control, readout])
