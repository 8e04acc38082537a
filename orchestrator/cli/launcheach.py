"""`dflashctl launch TARGET TARGET... --each [options] [-- CMD...]`: one run on each target, in one process.

Every target is launched at once (a host's containers too, over its one connection), so the runs' verify waits
overlap: a fleet's launch waits about one settle time, not one per run. Each target gets a result: a target
that could not be reached or refused the run is named with its reason, the others' runs are started all the
same (like kill and ps, never all-or-nothing), and the exit code is the worst of theirs. A run that ended during
its launch shows its log's last lines, as a single launch does; one that was started but not seen running in
time is left running and counted among the runs started, its target's error saying so (exit 3).
"""
from __future__ import annotations

import threading

from dflash_records.run import RunRecord

from ..errors import OperationFailed, UsageError
from ..inventory.model import Target
from ..runs.client import LaunchFailed, LaunchUnverified, RunClient
from ..runs.spec import LaunchSpec, new_run_id
from ..transports.fanout import fanout_exit_code, per_target
from ..transports.pool import Connections
from .launchreport import interrupted, report_failure
from .output import about, print_json, say, stderr, stdout
from .state import AppState


def split_targets(state: AppState, words: list[str], cut: int | None = None) -> tuple[list[Target], list[str]]:
    """The targets and the command: with `--` (at `cut`), every word before it is a target of the inventory and
    every word after it the command, even one that names a host; without, the leading words that name targets,
    the command starting at the first word that does not (a target given twice is launched once)."""
    inventory = state.inventory()
    if cut is not None:
        return _unique([inventory.target(word) for word in words[:cut]]), words[cut:]
    targets = []
    for index, word in enumerate(words):
        try:
            target = inventory.target(word)
        except UsageError:
            if index == 0:
                raise
            return _unique(targets), words[index:]
        targets.append(target)
    return _unique(targets), []


def _unique(targets: list[Target]) -> list[Target]:
    return list({t.name: t for t in targets}.values())


def launch_each(state: AppState, specs: list[LaunchSpec], *, preflight, as_json: bool) -> int:
    """Launch every spec (one per target) at once; `preflight(client, targets)` first refuses what doctor's
    checks of a config fail. Prints {"runs": [...], "targets": {T: {"ok", "run_id" | "error"}}} with --json: a
    run started but not seen running in time is among the runs, its target `"unverified": true` beside its
    error (exit 3)."""
    err = stderr()
    err.print(f"launching {specs[0].name} on {len(specs)} target{'' if len(specs) == 1 else 's'}...", markup=False)
    by_target = {spec.target.name: spec for spec in specs}
    _distinct_ids(specs)
    stopping = threading.Event()

    def launch_one(target: Target) -> RunRecord:
        if stopping.is_set():  # Ctrl-C: the targets not yet begun are left alone
            raise OperationFailed(f"{target.name}: not launched: interrupted")
        try:
            return client.launch(by_target[target.name])
        except KeyboardInterrupt:  # only this (the main) thread gets it; the others see `stopping`
            stopping.set()
            raise

    client = None
    try:
        with Connections() as conns:
            client = RunClient(state.inventory(), conns)
            preflight(client, [spec.target for spec in specs])
            outcomes = per_target([spec.target for spec in specs], launch_one)
    except KeyboardInterrupt:
        interrupted(client)
    _report(outcomes, as_json=as_json)
    return fanout_exit_code(outcomes)


def _report(outcomes: list, *, as_json: bool) -> None:
    """Every started run's id (on stdout; with --json the object), and on stderr each target's error, with the
    log tail of a run that ended during its launch."""
    err = stderr()
    runs = [o.value if o.ok else o.error.run for o in outcomes if o.ok or isinstance(o.error, LaunchUnverified)]
    report = {o.target.name: ({"ok": True, "run_id": o.value.run_id} if o.ok else
                              {"ok": False, "error": str(o.error), **_ended(o.error)}) for o in outcomes}
    for outcome in outcomes:  # on stderr with --json too, as ps names a target it could not read
        if not outcome.ok:
            if isinstance(outcome.error, LaunchFailed):
                report_failure(outcome.error, outcome.target.name)
            say(err, "dflashctl: error: " + about(outcome.target.name, str(outcome.error)))
    if as_json:
        print_json({"runs": [run.to_dict() for run in runs], "targets": report})
    else:
        for run in runs:
            stdout().print(run.run_id, markup=False)


def _distinct_ids(specs: list[LaunchSpec]) -> None:
    """Run ids of their own: ids made in the same second differ only in 4 random hex digits, which a fleet's
    worth of runs would share now and then (and `kill ID` would then find two)."""
    taken: set[str] = set()
    for spec in specs:
        run_id = spec.run_id or new_run_id(spec.name)
        while run_id in taken:
            run_id = new_run_id(spec.name)
        spec.run_id = run_id
        taken.add(run_id)


def _ended(error: Exception) -> dict:
    """What a run that ended during its launch left (its record: exit code, log tail), or the id of one left
    running unverified, beside the error."""
    if isinstance(error, LaunchUnverified):
        return {"run_id": error.run_id, "unverified": True}
    if isinstance(error, LaunchFailed) and error.answer.run is not None:
        return {"run": error.answer.run.to_dict(), "log_tail": list(error.answer.log_tail or ())}
    return {}


__all__ = ["launch_each", "split_targets"]
