"""The dashboard's data: one agent stream per container (stream.py) feeding per-run trackers (trackers.py) and
alert rules (alerts.py) in the live source (source.py), which assembles the view model the tui reads (model.py);
a multi-node job is folded into one row (jobrows.py)."""
