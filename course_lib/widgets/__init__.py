"""Teaching UI: ipywidgets views over results computed by the systems code."""
