"""Which run a process the keeper inherited came from: its workload, its session, the keeper's record, or the
run whose supervisor died last before it started. Pure: a made-up process table (pids past any pid_max, so
nothing real is read for them)."""
from __future__ import annotations

from dflash_agent.lineage import attribute
from dflash_agent.procfs import ProcStat

KEEPER = 10 ** 8
BASE = KEEPER + 1


def proc(n: int, ppid: int, start: int, *, sid: int | None = None, state: str = "S") -> ProcStat:
    pid = BASE + n
    return ProcStat(pid, "sleep", state, ppid, sid or pid, sid or pid, start)


def test_each_inherited_process_goes_to_the_run_it_came_from() -> None:
    states = {  # two runs whose supervisors died (not in the table), and one that never started one
        "a": {"supervisor_pid": BASE + 90, "supervisor_start_time": 100, "pid": BASE + 1, "pid_start_time": 110},
        "b": {"supervisor_pid": BASE + 91, "supervisor_start_time": 200, "pid": BASE + 2, "pid_start_time": 210},
        "c": {"supervisor_pid": None, "pid": None},
    }
    workload_a = proc(1, KEEPER, 110)
    child_a = proc(3, BASE + 1, 120, sid=BASE + 1)           # under a's workload
    session_b = proc(4, KEEPER, 220, sid=BASE + 2)           # in b's session, its workload gone
    loose_a = proc(5, KEEPER, 150)                            # own session, no trace: a died last before it
    loose_b = proc(6, KEEPER, 250)                            # ... and b before this one
    recorded = proc(7, KEEPER, 260)                           # the keeper saw it under a's tree earlier
    grandchild = proc(8, BASE + 7, 270)
    zombie = proc(9, KEEPER, 280, state="Z")
    stranger = proc(10, 1, 300)                               # not below the keeper: never anyone's
    table = {p.pid: p for p in (workload_a, child_a, session_b, loose_a, loose_b, recorded, grandchild, zombie,
                                stranger)}
    found = attribute(table, KEEPER, states, {(BASE + 7, 260): "a"})
    assert found == {(BASE + 1, 110): "a", (BASE + 3, 120): "a", (BASE + 4, 220): "b", (BASE + 5, 150): "a",
                     (BASE + 6, 250): "b", (BASE + 7, 260): "a", (BASE + 8, 270): "a"}


def test_nothing_is_guessed_for_a_run_whose_supervisor_still_lives() -> None:
    alive = proc(90, KEEPER, 100)  # the supervisor, alive: orphans of its run go to it, never to the keeper
    states = {"a": {"supervisor_pid": alive.pid, "supervisor_start_time": 100, "pid": None}}
    loose = proc(5, KEEPER, 150)
    assert attribute({alive.pid: alive, loose.pid: loose}, KEEPER, states, {}) == {}


def test_the_starter_of_a_queued_run_is_never_taken_for_an_ended_runs_leftover(monkeypatch) -> None:
    """The keeper starts a queued run's starter right after the run ahead of it ended: a kill of that run must
    not end the starter as one of its orphans (the queued run was then left `starting`, and later `lost`)."""
    from dflash_agent import lineage

    states = {"a": {"supervisor_pid": BASE + 90, "supervisor_start_time": 100, "pid": None}}
    starter = proc(5, KEEPER, 150)   # started after a's supervisor died: the guess would give it to a
    leftover = proc(6, KEEPER, 160)  # a process with no command line of ours: a's
    cmdlines = {starter.pid: "python3 /w/.dflash/agent/agent.pyz start-queued --runs-dir /w/runs --run-id q"}
    monkeypatch.setattr(lineage.procfs, "read_cmdline", lambda pid: cmdlines.get(pid, ""))
    found = attribute({starter.pid: starter, leftover.pid: leftover}, KEEPER, states, {})
    assert found == {(BASE + 6, 160): "a"}
