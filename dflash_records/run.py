"""The run record: what the agent keeps of one run, as `ps` lists it and the dashboard watches it.

The agent builds it from the run directory (`{workdir}/.dflash/runs/{run_id}/`): what `run.json` fixed at
launch (RUN_JSON_FIELDS), what `state.json` says now (STATE_JSON_FIELDS), and where the run's files are; the
controller adds what it read of the log (`last_step`, `tok_per_s`). On the wire and in `--json` output it is a
plain JSON object whose keys may be added to, never renamed: `to_dict` gives every field (None where unknown)
and keeps the keys a newer agent sent that this version does not know.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class RunRecord:
    run_id: str = ""
    # -- run.json: fixed at launch
    target: str | None = None
    name: str | None = None
    gpus: list | None = None             # GPU indices it holds ([] with --gpus none; None: every GPU)
    command: list | None = None
    cwd: str | None = None
    created_at: str | None = None        # ISO 8601, UTC, with a Z
    grace_s: float | None = None         # the seconds a kill waits after TERM
    job_id: str | None = None            # a multi-node job's node run: its job, its rank, the job's size
    node_rank: int | None = None
    nnodes: int | None = None
    relaunch_of: str | None = None       # the lost run this one relaunched
    worker_restarts: int | None = None
    job_relaunches: int | None = None    # a job node: how often its job was relaunched as a whole before this
    gpu_count: int | None = None         # --gpu-count N: any N free GPUs, chosen when it starts (then in gpus)
    sweep_id: str | None = None          # a sweep's run: its sweep, and the values of the grid's keys it runs
    sweep_values: dict | None = None
    # -- state.json: kept current by the supervisor
    state: str | None = None             # None: no state written yet, which is starting (agent/protocol.py)
    pid: int | None = None
    pgid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    supervisor_pid: int | None = None
    supervisor_start_time: int | None = None
    error: str | None = None
    attempt: int | None = None           # under a restart policy: this attempt, of max_attempts
    max_attempts: int | None = None
    restart_policy: str | None = None
    restart_at: str | None = None        # set only in the backoff between two attempts
    reason: str | None = None            # why it ended without another attempt: hung, crash loop
    attempts: list | None = None         # one record per attempt (docs/design.md)
    relaunched_as: str | None = None
    queued_at: str | None = None         # a run launched into its container's queue: when it was queued
    queue_position: int | None = None    # while queued: 1 for the next run to start (ps computes it)
    # -- where its files are
    log_path: str | None = None
    run_dir: str | None = None
    # -- read from its log by the controller
    last_step: int | None = None
    tok_per_s: float | None = None
    # keys this version does not know (a newer agent's): kept, so that to_dict gives them back
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data) -> RunRecord:
        """The record of a JSON object (anything but an object gives an empty record)."""
        data = data if isinstance(data, dict) else {}
        known = {name: data[name] for name in RECORD_KEYS if name in data}
        if not isinstance(known.get("run_id", ""), str):
            known.pop("run_id")
        return cls(extra={key: value for key, value in data.items() if key not in RECORD_KEYS}, **known)

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in RECORD_KEYS}
        out.update(self.extra)
        return out

    def with_figures(self, last_step: int | None, tok_per_s: float | None) -> RunRecord:
        """This record with the step figures the controller read of its log."""
        return replace(self, last_step=last_step, tok_per_s=tok_per_s)

    def attempt_record(self, attempt: int) -> dict | None:
        """The supervisor's record of one attempt (`attempts`: each an attempt's own record, docs/design.md)."""
        for entry in self.attempts or ():
            if isinstance(entry, dict) and entry.get("attempt") == attempt:
                return entry
        return None

    # -- how a run ended: written here and nowhere else

    def end_cause(self) -> str | None:
        """What ended its workload, short: `signal SIGKILL` (its number where the name is unknown), `exit code 3`;
        else the error recorded, else None."""
        if self.signal:
            return "signal {}".format(self.signal_name or self.signal)
        if self.exit_code is not None:
            return "exit code {}".format(self.exit_code)
        return self.error or None

    def ended_text(self) -> str:
        """How it ended, whole: `failed, exit code 127: command not found: x`, `killed, signal 15 (SIGTERM)`,
        `lost: supervisor gone without a terminal state`."""
        parts = [self.state or "ended"]
        if self.signal:
            named = " ({})".format(self.signal_name) if self.signal_name else ""
            parts.append("signal {}{}".format(self.signal, named))
        elif self.exit_code is not None:
            parts.append("exit code {}".format(self.exit_code))
        text = ", ".join(parts)
        return text + (": {}".format(self.error) if self.error else "")


RECORD_KEYS = tuple(f.name for f in fields(RunRecord) if f.name != "extra")
RUN_JSON_FIELDS = RECORD_KEYS[:RECORD_KEYS.index("state")]
STATE_JSON_FIELDS = RECORD_KEYS[RECORD_KEYS.index("state"):RECORD_KEYS.index("log_path")]
