"""`cleanup`: end orphans of ended runs (reaping the zombies that stuck ones hold), mark dead runs `lost`, and
report what cannot be fixed from here. It only ever ends processes of this runs directory's runs: zombies of
any other process are reported, never "fixed" by ending their parent (on a host, that parent may be another
container's PID 1)."""
from __future__ import annotations

import os
import time

from dflash_records.gpu import GPU_MEMORY_FIELDS, held_without_run
from dflash_records.plans import CleanupAction, CleanupAnswer, Finding, ForeignZombies

from . import gpus, lineage, procfs, terminate
from .keeper import KeeperPaths
from .rundir import RunPaths, list_run_ids, read_json, unfollowed_run_dirs
from .runstate import is_live, read_run, read_state, settle_liveness

ZOMBIE_CONFIRM_S = 0.3  # a zombie seen twice this far apart is not one its parent is about to reap
REPARENT_WAIT_S = 0.5
ADVICE_INIT_ZOMBIES = ("PID 1 of this container does not reap its children, so nothing inside the container can "
                       "clear these zombies: only a container restart does. A restart wipes /dev/shm (copy anything "
                       "kept there, such as model weights, to disk first). They hold pids, not memory or GPUs.")
ADVICE_OUTSIDE = "their parent lives outside this PID namespace (e.g. the host's pct/lxc-attach); it reaps them when it exits"
ADVICE_FOREIGN = ("Whoever owns that process has to reap them or end it; if it is another container's PID 1, which "
                  "never reaps, only a restart of that container clears them. They hold pids, not memory or GPUs.")
ADVICE_CLAIMS = ("DFLASH_RUN_ID is only a variable, which anyone can set: cleanup ends a process only where its "
                 "lineage ties it to a run (see docs/design.md). End these yourself if they are yours.")
ADVICE_GPU = ("GPU memory is held while no run of this runs directory is live on that GPU. nvidia-smi inside a "
              "container cannot name the process: look for a stuck process (here or in another container of "
              "the host) or restart the container.")


class Cleanup:
    def __init__(self, runs_dir: str, *, dry_run: bool, grace: float) -> None:
        self.runs_dir = os.path.abspath(runs_dir)
        self.dry_run = dry_run
        self.grace = grace
        self.actions = []
        self.findings = []
        self.foreign_zombies = []

    def action(self, **fields) -> dict:
        fields.setdefault("done", not self.dry_run)
        fields.setdefault("ok", True)
        self.actions.append(fields)
        return fields

    def mark_dead_runs(self) -> None:
        for skipped in unfollowed_run_dirs(self.runs_dir):
            self.findings.append(dict(skipped, kind="run_dir_not_followed", description="{} ({} -> {}): {}".format(
                skipped["run_id"], skipped["path"], skipped["points_to"], skipped["reason"])))
        for run_id in list_run_ids(self.runs_dir):
            _, newly_lost = settle_liveness(RunPaths(self.runs_dir, run_id), dry_run=self.dry_run)
            if newly_lost:
                self.action(action="mark_lost", run_id=run_id, detail="supervisor gone without a terminal state",
                            description="mark run {} lost: its supervisor is gone".format(run_id))

    def live_runs(self) -> dict:
        live = {}
        for run_id in list_run_ids(self.runs_dir):
            paths = RunPaths(self.runs_dir, run_id)
            run, state = read_run(paths), read_state(paths)
            if is_live(paths, run, state):
                live[run_id] = (run, state)
        return live

    def orphans(self, live: dict) -> dict:
        """pid -> (run id, why) of processes left by runs that are no longer live, each proven ours
        (identity.py): by the ended workload's session (for a child that cleared its environment), and by the
        keeper's record of what it inherited (for one that also left the session). Never by DFLASH_RUN_ID
        alone, which anyone can set, and never in another PID namespace (a container's, seen from its
        host)."""
        table = procfs.snapshot()
        below_keeper = lineage.members(self.runs_dir, KeeperPaths(self.runs_dir).dir, table)
        found = {}
        for run_id in sorted(set(list_run_ids(self.runs_dir)) - set(live)):
            paths = RunPaths(self.runs_dir, run_id)
            for pid in lineage.run_session(paths, read_state(paths), table, below_keeper):
                found.setdefault(pid, (run_id, "run {} has ended (a process of its session)".format(run_id)))
        for (pid, _), run_id in below_keeper.items():
            if run_id not in live:
                found.setdefault(pid, (run_id, "run {} has ended (an orphan the keeper inherited)".format(run_id)))
        self.report_claims(live, found, table, below_keeper)
        return {pid: why for pid, why in found.items() if procfs.in_our_pid_namespace(pid)}

    def report_claims(self, live: dict, found: dict, table: dict, below_keeper: dict) -> None:
        """Processes here whose environment names a run of this runs directory, which nothing proves ours:
        left alone, and said."""
        ours = set(found) | {pid for (pid, _), run_id in below_keeper.items() if run_id in live}
        for run_id, (_, state) in live.items():
            ours.update(procfs.descendants(table, state.get("supervisor_pid")))
            ours.update(lineage.run_session(RunPaths(self.runs_dir, run_id), state, table, below_keeper))
        claims = sorted(pid for pid, (_, env) in procfs.processes_with_env("DFLASH_RUN_ID", table).items()
                        if env.get("DFLASH_RUNS_DIR") == self.runs_dir and pid not in ours
                        and procfs.in_our_pid_namespace(pid) and procfs.sees_as_ours(pid, self.runs_dir))
        if claims:
            self.findings.append({"kind": "unproven_run_processes", "pids": claims, "advice": ADVICE_CLAIMS,
                                  "processes": [procfs.describe(pid) for pid in claims],
                                  "description": "{} process(es) name a run of this runs directory in their "
                                                 "environment ({}) but nothing ties them to it: left alone. {}".format(
                                                     len(claims), ", ".join(map(str, claims)), ADVICE_CLAIMS)})

    def end_orphans(self, live: dict, zombies: dict) -> set:
        """End what ended runs left behind; one that holds zombies is a stuck parent, and they go with it.
        Returns the pids planned."""
        held = zombie_children(zombies)
        targets, planned = [], []
        for pid, (run_id, reason) in sorted(self.orphans(live).items()):
            start = procfs.start_time(pid)
            if start is None:
                continue
            cmdline = procfs.read_cmdline(pid)
            kids = held.get(pid)
            if kids:
                entry = self.action(action="end_stuck_parent", pid=pid, run_id=run_id, cmdline=cmdline, zombies=kids,
                                    detail="{}; {} zombie child(ren) it never reaps".format(reason, len(kids)),
                                    description="end stuck parent {} ({}) of {} zombie(s): {}".format(
                                        pid, cmdline[:60], len(kids), reason))
            else:
                entry = self.action(action="end_orphan", pid=pid, run_id=run_id, cmdline=cmdline, detail=reason,
                                    description="end orphan {} ({}): {}".format(pid, cmdline[:60], reason))
            planned.append(entry)
            targets.append((pid, start))
        if targets and not self.dry_run:
            survivors, _ = terminate.end_processes(targets, grace=self.grace)
            for entry in planned:
                entry["ok"] = entry["pid"] not in survivors
            self._count_reaped([entry for entry in planned if entry.get("zombies")], zombies)
        return {entry["pid"] for entry in planned}

    def _count_reaped(self, stuck: list, zombies: dict) -> None:
        if not stuck:
            return
        time.sleep(REPARENT_WAIT_S)  # let the new parent (a subreaper or PID 1) reap what it adopted
        for entry in stuck:
            left = [z for z in entry["zombies"] if procfs.exists_as(z, zombies[z].start_time)]
            entry.update(reaped=len(entry["zombies"]) - len(left), still_zombies=left)
            if left:
                entry["description"] += "; {} still zombies (now PID 1's, which does not reap)".format(len(left))

    def protected_pids(self, live: dict, table: dict) -> dict:
        """pid -> why we must not end it although it has zombie children."""
        protected = {pid: "the agent itself" for pid in procfs.own_lineage()}
        keeper = read_json(KeeperPaths(self.runs_dir).info) or {}
        if procfs.is_alive(keeper.get("pid"), keeper.get("start_time")):
            protected[keeper["pid"]] = "the keeper (it reaps)"
        for run_id, (_, state) in live.items():
            sup = state.get("supervisor_pid")
            if sup:
                protected[sup] = "supervisor of live run {} (it reaps)".format(run_id)
                for pid in procfs.descendants(table, sup):
                    protected[pid] = "process of live run {}".format(run_id)
        return protected

    def report_zombies(self, live: dict, planned: set, zombies: dict, table: dict) -> None:
        """Say whose zombies are left. Only a process of one of our runs is ever ended (end_orphans did that);
        any other parent, however stuck, belongs to someone else: another program, another container's PID 1
        seen from the host. Those are listed under foreign_zombies and left alone."""
        protected = self.protected_pids(live, table)
        for parent, pids in sorted(zombie_children(zombies).items()):
            if parent == 1 or parent in planned:
                continue  # PID 1's are reported below; a planned orphan's action names them
            if parent == 0 or parent not in table:
                self.findings.append({"kind": "zombies_parent_outside", "count": len(pids), "pids": pids,
                                      "advice": ADVICE_OUTSIDE, "description": "{} zombie(s): {}".format(
                                          len(pids), ADVICE_OUTSIDE)})
            elif parent in protected:
                if "live run" in protected[parent] and "supervisor" not in protected[parent]:
                    self.findings.append({"kind": "zombies_in_live_run", "parent": procfs.describe(parent),
                                          "count": len(pids), "pids": pids, "detail": protected[parent],
                                          "description": "{} zombie(s) under pid {}, a {}: left alone".format(
                                              len(pids), parent, protected[parent])})
            else:
                owner = procfs.describe(parent)
                self.foreign_zombies.append({
                    "parent": owner, "count": len(pids), "pids": pids, "advice": ADVICE_FOREIGN,
                    # the advice is the same for every such parent: whoever shows the list says it once
                    "description": "{} zombie(s) of pid {} ({}), which no dflashctl run owns: left alone".format(
                        len(pids), parent, owner["cmdline"][:60])})
        init_pids = sorted(pid for pid, stat in zombies.items() if stat.ppid == 1)
        if init_pids:
            self.findings.append({"kind": "zombies_of_init", "count": len(init_pids), "pids": init_pids,
                                  "init": procfs.describe(1), "advice": ADVICE_INIT_ZOMBIES,
                                  "description": "{} zombie(s) of PID 1: {}".format(len(init_pids),
                                                                                   ADVICE_INIT_ZOMBIES)})

    def check_gpus(self, live: dict) -> dict:
        result = gpus.query_gpus()
        held = held_without_run(result["gpus"], [run.get("gpus") for run, _ in live.values()])
        if held:
            self.findings.append({"kind": "gpu_memory_held", "gpus": [g.to_dict(GPU_MEMORY_FIELDS) for g in held],
                                  "advice": ADVICE_GPU,
                                  "description": "GPU {} hold{} memory ({}): {}".format(
                                      ",".join(str(g.index) for g in held), "s" if len(held) == 1 else "",
                                      ", ".join("{} MiB at {} %".format(g.memory_used_mib, g.utilization_pct)
                                                for g in held), ADVICE_GPU)})
        return {**result, "gpus": [g.to_dict(GPU_MEMORY_FIELDS) for g in result["gpus"]]}

    def run(self) -> CleanupAnswer:
        self.mark_dead_runs()
        live = self.live_runs()
        zombies, table = persistent_zombies()
        planned = self.end_orphans(live, zombies)
        if planned and not self.dry_run:
            zombies, table = persistent_zombies()  # after the ended ones' zombies found their new parent
        self.report_zombies(live, planned, zombies, table)
        gpu_result = self.check_gpus(live)
        return CleanupAnswer(ok=all(a["ok"] for a in self.actions), dry_run=self.dry_run,
                             actions=tuple(map(CleanupAction.from_dict, self.actions)),
                             findings=tuple(map(Finding.from_dict, self.findings)),
                             foreign_zombies=tuple(map(ForeignZombies.from_dict, self.foreign_zombies)),
                             gpus=gpu_result, live_runs=tuple(sorted(live)))


def persistent_zombies() -> tuple:
    """(pid -> ProcStat of zombies seen in two snapshots, the later full snapshot)."""
    first = {pid: stat for pid, stat in procfs.snapshot().items() if stat.is_zombie}
    if first:
        time.sleep(ZOMBIE_CONFIRM_S)
    table = procfs.snapshot()
    zombies = {pid: stat for pid, stat in table.items()
               if stat.is_zombie and pid in first and first[pid].start_time == stat.start_time}
    return zombies, table


def zombie_children(zombies: dict) -> dict:
    """parent pid -> sorted pids of its zombies."""
    held = {}
    for stat in zombies.values():
        held.setdefault(stat.ppid, []).append(stat.pid)
    return {parent: sorted(pids) for parent, pids in held.items()}


def cleanup(runs_dir: str, *, dry_run: bool, grace: float) -> CleanupAnswer:
    return Cleanup(runs_dir, dry_run=dry_run, grace=grace).run()
