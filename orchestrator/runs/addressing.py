"""Which runs a RUN argument names: a run or job id, the name given at launch, or a unique prefix of an id.

People address runs as they address containers: `dflashctl logs ticker` (the newest live run named ticker,
else the newest of that name) or `dflashctl kill ticker-2612` (the one run whose id begins so). In that order:
an exact run id, an exact job id, a name, a prefix; a prefix that begins several ids is refused with the
candidates listed. A multi-node job counts as one: its name and its id name all of its node runs.

A full run or job id that the local cache (whereabouts) places is looked up on those targets alone; anything
else, or a cache entry that proves wrong (its target answers without the run, or is not in this inventory),
sweeps every target of the inventory. A placed target that does not answer is reported as such: a run lives
on one target, and asking a fleet's every other one only to find it nowhere took 11-23 s.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dflash_records.protocol import LIVE_STATES, QUEUED
from dflash_records.run import RunRecord

from ..errors import DflashError, OperationFailed, TargetNotFound, Unreachable, UsageError, shorten
from ..inventory.model import Target
from . import whereabouts
from .client import RunClient
from .spec import check_run_id

MAX_CANDIDATES = 10


@dataclass
class Match:
    """What one RUN argument named: a run (`kind` "run") or every node run of a job (`kind` "job")."""

    ref: str
    kind: str
    id: str
    runs: list[tuple[Target, RunRecord]] = field(default_factory=list)
    note: str | None = None   # which of several same-named runs was taken, for the user to read

    @property
    def live(self) -> bool:
        """Some run of it has not ended: it runs, or (queued) waits to; what a name picks first, and what `kill`
        of a name shared by several refuses to guess between."""
        return any(record.state in LIVE_STATES or record.state == QUEUED for _, record in self.runs)

    @property
    def created_at(self) -> str:
        return min((record.created_at or "" for _, record in self.runs), default="")

    @property
    def name(self) -> str | None:
        return self.runs[0][1].name if self.runs else None

    def describe(self) -> str:
        targets = sorted({target.name for target, _ in self.runs})
        one = self.runs[0][1].state if len(self.runs) == 1 else None
        state = one if one == QUEUED else "live" if self.live else (one or "ended")
        return f"{self.id} ({'job ' if self.kind == 'job' else ''}{state} on {', '.join(targets)})"


def locate(client: RunClient, refs: list[str], *, one_live: bool = False) -> list[Match]:
    """One Match per RUN argument, from one sweep of every target; raises when one names nothing or is
    ambiguous, before anything is done to any of them. With `one_live` (what `kill` asks), a name that several
    live runs carry is ambiguous too: the newest is a guess that must not stop the wrong run."""
    for ref in refs:
        check_run_id(ref)
    known = _where_known(client, refs, one_live=one_live)
    if known is not None:
        return known
    outcomes = client.list_runs(client.inventory.all_targets())
    runs = typed(outcomes)
    matches, missing = [], []
    for ref in refs:
        match = resolve(ref, runs, one_live=one_live)
        if match is None:
            missing.append(ref)
        else:
            matches.append(match)
    if missing:
        _raise_missing(missing, outcomes)
    return matches


def _where_known(client: RunClient, refs: list[str], *, one_live: bool) -> list[Match] | None:
    """The Matches when every ref is a full run or job id that the local cache places (whereabouts) and each is
    found whole on the targets it names, asking only those; None sends the caller to sweep every target; an
    error when one of those targets does not answer."""
    places = whereabouts.places(refs)
    if places is None:
        return None
    try:
        targets = client.inventory.targets(sorted({name for names in places.values() for name in names}))
    except DflashError:  # a target this inventory does not have: the cache came from another
        return None
    outcomes = client.list_runs(targets)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        _raise_unanswered(refs, failed)
    runs = typed(outcomes)
    matches = [resolve(ref, runs, one_live=one_live) for ref in refs]
    if all(m is not None and m.id == ref and _whole(m) for ref, m in zip(refs, matches)):
        return matches  # type: ignore[return-value]
    return None


def _raise_unanswered(refs: list[str], failed: list) -> None:
    """The target(s) the cache places the runs on did not answer: say so, with their errors (exit 3 for an
    unreachable one)."""
    why = "; ".join(str(o.error) if str(o.error).startswith(o.target.name) else f"{o.target.name}: {o.error}"
                    for o in failed)
    unreachable = any(isinstance(o.error, Unreachable) for o in failed)
    where = ", ".join(o.target.name for o in failed)
    raise (Unreachable if unreachable else OperationFailed)(
        f"cannot look up {', '.join(map(repr, refs))}: {where}, where it was last seen, "
        f"{'is unreachable' if unreachable else 'did not answer'}: {why}")


def typed(outcomes: list) -> list[tuple[Target, RunRecord]]:
    """(target, run record) of every run the targets that answered listed."""
    return [(o.target, record) for o in outcomes for record in o.value or []]


def _whole(match: Match) -> bool:
    """Every node of a job was found (a job's nodes may have moved on since the cache saw them)."""
    return match.kind != "job" or all(len(match.runs) == (r.nnodes or len(match.runs)) for _, r in match.runs)


def _raise_missing(missing: list[str], outcomes: list) -> None:
    names = ", ".join(map(repr, missing))
    failed = [o for o in outcomes if not o.ok]
    down = [f"{o.target.name} ({o.error})" for o in failed if isinstance(o.error, Unreachable)]
    if down:  # it may well be on a target we could not reach: an outage (exit 3), not a typo
        raise Unreachable(f"cannot look up {names}: unreachable: {'; '.join(down)} (no target that answered "
                          f"has it)")
    others = [f"{o.target.name} ({o.error})" for o in failed]
    hint = f"; not searched: {'; '.join(others)}" if others else ""
    raise TargetNotFound(f"no run or job {names} on any target (a run id, a unique prefix of one, or the name "
                         f"given at launch; see `dflashctl ps`){hint}")


def resolve(ref: str, runs: list[tuple[Target, RunRecord]], *, one_live: bool = False) -> Match | None:
    """The Match for `ref` among every known run, None when nothing matches; UsageError when ambiguous (with
    `one_live`, also a name of several live runs)."""
    exact = [(t, r) for t, r in runs if r.run_id == ref]
    if exact:
        return Match(ref, "run", ref, exact[:1])
    units = _units(runs)
    if ref in units["job"]:
        return units["job"][ref]
    named = [m for m in [*units["run"].values(), *units["job"].values()] if m.name == ref]
    if named:
        live = [m for m in named if m.live]
        if one_live and len(live) > 1:
            _refuse(f"{shorten(ref)!r} names {len(live)} live runs", live, "Give the id of the one to stop (or each)")
        return _newest(ref, named)
    return _by_prefix(ref, runs, units)


def _units(runs: list[tuple[Target, RunRecord]]) -> dict[str, dict[str, Match]]:
    """Plain runs by run id and jobs (all their nodes) by job id: what a name or a prefix can name."""
    plain: dict[str, Match] = {}
    jobs: dict[str, Match] = {}
    for target, record in runs:
        if record.job_id:
            jobs.setdefault(record.job_id, Match(record.job_id, "job", record.job_id)).runs.append((target, record))
        else:
            plain.setdefault(record.run_id, Match(record.run_id, "run", record.run_id, [(target, record)]))
    for job in jobs.values():
        job.runs.sort(key=lambda tr: tr[1].node_rank or 0)
    return {"run": plain, "job": jobs}


def _newest(ref: str, named: list[Match]) -> Match:
    live = [m for m in named if m.live]
    pool = live or named
    chosen = max(pool, key=lambda m: (m.created_at, m.id))
    chosen = Match(ref, chosen.kind, chosen.id, chosen.runs)
    if len(named) > 1:
        which = "the newest live one" if live else "the newest (none is live)"
        chosen.note = (f"{ref!r} names {len(named)} runs; using {which}: {chosen.describe()}. "
                       f"Give its id to choose another (`dflashctl ps` lists them).")
    return chosen


def _by_prefix(ref: str, runs: list[tuple[Target, RunRecord]], units: dict[str, dict[str, Match]]) -> Match | None:
    found = [m for m in [*units["run"].values(), *units["job"].values()] if m.id.startswith(ref)]
    covered = {m.id for m in found if m.kind == "job"}
    # a prefix longer than its job's id may name one node run of the job (`JOB-n1`)
    found += [Match(r.run_id, "run", r.run_id, [(t, r)]) for t, r in runs
              if r.job_id and r.run_id.startswith(ref) and r.job_id not in covered]
    if not found:
        return None
    if len(found) == 1:
        return Match(ref, found[0].kind, found[0].id, found[0].runs)
    _refuse(f"{shorten(ref)!r} begins {len(found)} run ids", found, "Give more of the id")


def _refuse(what: str, candidates: list[Match], advice: str) -> None:
    """An ambiguous RUN: a UsageError listing the candidates, newest first."""
    candidates = sorted(candidates, key=lambda m: m.created_at, reverse=True)
    listed = "; ".join(m.describe() for m in candidates[:MAX_CANDIDATES])
    more = f"; and {len(candidates) - MAX_CANDIDATES} more" if len(candidates) > MAX_CANDIDATES else ""
    raise UsageError(f"{what}: {listed}{more}. {advice}.")


__all__ = ["Match", "locate", "resolve"]
