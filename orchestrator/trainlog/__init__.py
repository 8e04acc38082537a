"""The reader of the trainer's log format: line parsers (lines.py), traceback grouping (tracebacks.py) and the
incremental stream parser that never raises (parser.py)."""
