"""Whether a live process is one of ours: the proofs `kill` and `cleanup` need before they signal anything.

A pid is only a number: it gets reused, a record naming it may be stale or planted, and an environment variable
(DFLASH_RUN_ID) is something anyone can set. What counts as proof that a process belongs to a run of this runs
directory (docs/design.md, "What counts as ours"):

- it is the run's supervisor or the keeper: the pid a record names, started at the recorded time (from
  /proc/PID/stat), running the agent's own command for this runs directory (and run id), in our PID namespace,
  with that runs directory, seen through its own root (/proc/PID/root), the very directory we read;
- it descends from such a supervisor (every process of a run stays below it: it is a child subreaper);
- it is a member of the session the run's workload leads (recorded by the supervisor, pid + start time): a
  process can only inherit its session or start its own, so only the workload's descendants carry it;
- the keeper inherited it, and recorded which run it came from (lineage.py).

Nothing in another PID namespace is ever ours: seen from a host, a container's processes are not, whatever
their paths or environment say; and a path a process names is compared as that process sees it.
"""
from __future__ import annotations

import os

from . import procfs

SUPERVISE = "supervise"
KEEPER = "keeper"


def agent_command(pid: int) -> dict:
    """The agent subcommand `pid` runs, with its options: {"command": "supervise", "--runs-dir": ..., ...};
    empty when it runs none."""
    argv = procfs.read_argv(pid)
    for index, word in enumerate(argv):
        if word in (SUPERVISE, KEEPER):
            found = {"command": word}
            rest = argv[index + 1:]
            for option, value in zip(rest, rest[1:]):
                if option.startswith("--") and option not in found:
                    found[option] = value
            return found
    return {}


def not_ours(pid: int, start: int | None, command: str, runs_dir: str, run_id: str | None = None) -> str | None:
    """Why the live process `pid` is not the agent's `command` (supervise, keeper) of `runs_dir` (and run id)
    that a record says started at `start`; None when it is. Call it on a live pid only."""
    if start is None:
        return "no start time is recorded for pid {}, so it cannot be told from a stranger".format(pid)
    if procfs.start_time(pid) != start:
        return "pid {} is a newer process than the one recorded".format(pid)
    if not procfs.in_our_pid_namespace(pid):
        return "pid {} lives in another PID namespace (a container's, seen from its host)".format(pid)
    found = agent_command(pid)
    wanted = {"command": command, "--runs-dir": os.path.abspath(runs_dir)}
    if run_id is not None:
        wanted["--run-id"] = run_id
    if any(found.get(key) != value for key, value in wanted.items()):
        return "pid {} runs {!r}, not the {} of {}{}".format(
            pid, procfs.read_cmdline(pid)[:120], command, runs_dir, " run " + run_id if run_id else "")
    if not procfs.sees_as_ours(pid, runs_dir):
        return "pid {} names {} in another mount namespace, where that path is another directory".format(
            pid, runs_dir)
    return None
