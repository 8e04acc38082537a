"""The records that cross a boundary, each defined once: what a training step reports (step.py), what the
agent keeps of a run (run.py), the agent's answers (answers.py, plans.py, on the codec of wire.py) and a job as
its nodes sum it up (job.py).

Both bundles carry this package: the trainer's (unpacked beside `trainer/` on a run's PYTHONPATH) and the
agent's zipapp (at its root, beside `dflash_agent/`). So it is stdlib only, runs on any Python >= 3.8, and
imports nothing of the project: the writer in the trainer, the agent and every reader in the controller use
the same code.
"""
