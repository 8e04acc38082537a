"""Runs seen from the controller: what to start (spec.py, command.py), the one client of the agent (client.py),
multi-node jobs (jobs.py), shipping the agent and trainer (bundle.py, deploy.py), naming runs on the command
line (addressing.py), every read of the trainer's config (trainerconfig.py) and the targets' health (doctor.py)."""
