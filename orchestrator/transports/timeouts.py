"""How long the controller waits for each kind of remote command, in one place, each with why.

A timeout here is a verdict on the host (a command that takes longer is stuck, or the host is in trouble), not
on the work: none of these should ever be reached by a healthy target, even a busy one.
"""
from __future__ import annotations

# any command not named below: a minute is beyond what a healthy host needs for a short command
DEFAULT_TIMEOUT = 60.0
# one quick question (pct status, `python -c`, nvidia-smi's query, df, the host facts, the version probe): it
# answers in well under a second; 30 s is a host swapping hard or a hung NFS mount, worth reporting as such
PROBE_TIMEOUT_S = 30.0
# one agent request (ps, netinfo, probe): a Python start-up plus reading run directories and /proc; also the
# time a kill may take beyond the run's grace period (the agent verifies that nothing of the run is left)
AGENT_TIMEOUT_S = 60.0
# ending, on the host, a command that timed out (kill on its process group: TERM, KILL 2 s later if need be)
END_COMMAND_TIMEOUT_S = 10.0
# a command with a timeout also carries a bound of its own on the host (remotegroup.bounded): the host ends it
# (TERM, then KILL after the grace) this long after the controller's timeout, even when the controller never gets
# to end it itself (killed, out of file descriptors, or so loaded that its ending timed out too); the margin is
# the controller's, to notice its timeout and end the command first
HOST_BOUND_MARGIN_S = 5.0
HOST_BOUND_GRACE_S = 2.0
# reading the end of a log (`logs`): tail over one stream, a minute even for a slow disk
LOG_READ_TIMEOUT_S = 60.0
# measuring the compile cache (du over many small files on possibly slow storage): only a warning past it
DISK_USAGE_TIMEOUT_S = 60.0
# deploy's check of what is installed: hashes the agent file, a few hundred KiB
DEPLOY_CHECK_TIMEOUT_S = 60.0
# cleanup ends stuck parents and waits for each to go (TERM, then KILL): several short waits in a row
CLEANUP_TIMEOUT_S = 120.0
# a launch runs the trainer's config check (one Python start-up with pydantic) and then waits for the run to
# settle: both together stay well under two minutes on any target we have seen
LAUNCH_TIMEOUT_S = 120.0
# uploading the trainer bundle (a few MiB) over a slow or distant link
UPLOAD_TIMEOUT_S = 300.0
# how long a node of a multi-node job waits for its peers at the rendezvous (torchrun's --stall under the
# agent's node-watch): nodes start a few seconds apart, but a cold container may first load a large target
DEFAULT_DIST_TIMEOUT_S = 300.0
# pull's listing of a run's files: checkpoints the trainer wrote without a manifest are hashed on the target,
# several GB at disk speed
PULL_PLAN_TIMEOUT_S = 600.0
# pull --export makes the serving copy on the target first: a Python start-up with torch, the weights read, cast
# and written once
EXPORT_TIMEOUT_S = 600.0
# pull gives up on a file (and keeps what arrived, for the next pull to resume) after this long without a byte:
# a link that silently drops packets never says it is gone
PULL_STALL_S = 30.0
