"""Outputs: a run as data (the Report and its JSON), as machine formats for CI, as a
self-contained HTML page, and saved reports over time."""
