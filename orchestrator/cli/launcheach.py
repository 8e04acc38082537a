"""`dflashctl launch TARGET TARGET... --each [options] [-- CMD...]`: one run on each target, in one process.

Every target is launched at once (a host's containers too, over its one connection), so the runs' verify waits
overlap: a fleet's launch waits about one settle time, not one per run. Each target gets a result: a target
that could not be reached or refused the run is named with its reason, the others' runs are started all the
same (like kill and ps, never all-or-nothing), and the exit code is the worst of theirs.
"""
from __future__ import annotations

from dflash_records.run import RunRecord

from ..errors import UsageError
from ..inventory.model import Target
from ..runs.client import LaunchFailed, RunClient
from ..runs.spec import LaunchSpec, new_run_id
from ..transports.fanout import fanout_exit_code, per_target
from ..transports.pool import Connections
from .output import about, print_json, say, stderr, stdout
from .state import AppState


def split_targets(state: AppState, words: list[str]) -> tuple[list[Target], list[str]]:
    """The leading words that name targets of the inventory, and the command that starts at the first word that
    does not (CMD after `--`; a target given twice is launched once)."""
    inventory, targets = state.inventory(), []
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
    checks of a config fail. Prints {"runs": [...], "targets": {T: {"ok", "run_id" | "error"}}} with --json."""
    err = stderr()
    err.print(f"launching {specs[0].name} on {len(specs)} target{'' if len(specs) == 1 else 's'}...", markup=False)
    by_target = {spec.target.name: spec for spec in specs}
    _distinct_ids(specs)
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        preflight(client, [spec.target for spec in specs])
        outcomes = per_target([spec.target for spec in specs], lambda t: client.launch(by_target[t.name]))
    runs = [o.value for o in outcomes if o.ok]
    report = {o.target.name: ({"ok": True, "run_id": RunRecord.from_dict(o.value).run_id} if o.ok else
                              {"ok": False, "error": str(o.error), **_ended(o.error)}) for o in outcomes}
    for outcome in outcomes:  # on stderr with --json too, as ps names a target it could not read
        if not outcome.ok:
            say(err, "dflashctl: error: " + about(outcome.target.name, str(outcome.error)))
    if as_json:
        print_json({"runs": runs, "targets": report})
    else:
        for run in map(RunRecord.from_dict, runs):
            stdout().print(run.run_id, markup=False)
    return fanout_exit_code(outcomes)


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
    """What a run that ended during its launch left: its record (exit code, log tail) beside the error."""
    if isinstance(error, LaunchFailed) and error.payload.get("run"):
        return {"run": error.payload["run"], "log_tail": error.payload.get("log_tail") or []}
    return {}


__all__ = ["launch_each", "split_targets"]
