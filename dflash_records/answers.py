"""The agent's answers, typed: one frozen dataclass per subcommand's answer, with its codec beside it.

The agent builds its answer as one of these and serialises it once (`to_dict`, then one line of JSON with the
protocol version); the controller parses it once where the agent call returns (`from_dict`) and reads fields
from then on. The JSON is the wire's and `--json`'s: keys may be added, never renamed, and an agent of the last
version is understood (wire.py: unknown keys kept, missing ones left at their defaults).

Every answer has `ok`, and when it is false `error` and `code` (the agent's error codes, protocol.py) with
what the code's details add. The sub-records of an answer (a kill's one run, a cleanup's action, a file of a
pull plan) are here too, each where its answer is; what a pull plan, a cleanup and a probe carry is in
plans.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .run import RunRecord
from .wire import WireRecord, decode, each, encode, extra_keys, of

# the keys every answer may carry when it failed, given only when set
FAILURE = ("error", "code")


@dataclass(frozen=True)
class CheckResult(WireRecord):
    """What the workload's check (the trainer's check of a config) said: its exit code and its output."""

    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    extra: dict = extra_keys()


@dataclass(frozen=True)
class LaunchAnswer(WireRecord):
    """launch: the verified run and the live runs of the same name; failed: why (run_ended, not_verified,
    gpus_busy with `busy`, check_failed with `check`), with the run as far as it got and the ends of its logs."""

    ok: bool = False
    run: RunRecord | None = of(RunRecord, optional=True)
    namesakes: tuple | None = each(optional=True)
    error: str | None = None
    code: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: tuple | None = each(optional=True)
    supervisor_log_tail: tuple | None = each(optional=True)
    keeper_log_tail: tuple | None = each(optional=True)
    busy: dict | None = None
    check: CheckResult | None = of(CheckResult, optional=True)
    extra: dict = extra_keys()


    def to_dict(self) -> dict:
        # a run that ended or was left unverified comes with how it ended, even where that is unknown (null)
        said = ("exit_code", "signal") if not self.ok and self.run is not None else ()
        return encode(self, skip_none=tuple(key for key in LAUNCH_OPTIONAL if key not in said))


LAUNCH_OPTIONAL = FAILURE + ("run", "namesakes", "exit_code", "signal", "log_tail", "supervisor_log_tail",
                             "keeper_log_tail", "busy", "check")


@dataclass(frozen=True)
class CheckAnswer(WireRecord):
    """check: the workload's check in a run's environment (failed: code check_failed, the same `check`)."""

    SKIP_NONE = FAILURE

    ok: bool = False
    check: CheckResult = of(CheckResult)
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class SkippedRunDir(WireRecord):
    """A run directory ps did not read: a symbolic link, never read or written through."""

    run_id: str | None = None
    path: str | None = None
    points_to: str | None = None
    reason: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class PsAnswer:
    """ps: every run's record (or the named ones'), and when asked for each run's log tail and the last records of
    its metrics.jsonl (`log_tails`, `metrics_tails`, in the order of `runs`; on the wire each is its record's
    `log_tail` / `metrics_tail`)."""

    ok: bool = False
    runs: tuple = each(RunRecord)
    skipped: tuple = each(SkippedRunDir)
    log_tails: tuple = ()
    metrics_tails: tuple = ()
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()

    TAILS = (("log_tails", "log_tail"), ("metrics_tails", "metrics_tail"))

    @classmethod
    def from_dict(cls, data) -> PsAnswer:
        data = data if isinstance(data, dict) else {}
        runs = [run for run in data.get("runs") or () if isinstance(run, dict)]
        tails = {field: tuple(_text_or_none(run.get(key)) for run in runs) for field, key in cls.TAILS}
        wire_keys = {key for _, key in cls.TAILS}
        runs = [{key: value for key, value in run.items() if key not in wire_keys} for run in runs]
        return decode(cls, dict(data, runs=runs, **tails))

    def to_dict(self) -> dict:
        out = encode(self, skip_none=FAILURE)
        for field, key in self.TAILS:
            for run, tail in zip(out["runs"], out.pop(field)):
                if tail is not None:
                    run[key] = tail
        return out


def _text_or_none(value) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ProcessInfo(WireRecord):
    """A process as the agent describes it (procfs.describe): a survivor of a kill, a zombie's parent."""

    pid: int | None = None
    cmdline: str = ""
    state: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class Refusal(WireRecord):
    """A pid state.json names that is not the run's (a reused pid): never signalled."""

    pid: int | None = None
    role: str | None = None
    reason: str | None = None
    process: dict | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class KilledRun(WireRecord):
    """What a kill did to one run: how it ended (`run`, its record after the kill), what it did, what survived
    (`ok` false then), and `state_error` when the end could not be written to state.json. `was_queued`: it was
    still queued, and the kill took it out of its queue (nothing of it had started); `already_ended`: it had
    ended before the kill."""

    SKIP_NONE = ("state_error",)

    run_id: str = ""
    ok: bool = False
    state: str | None = None
    signal: int | None = None
    exit_code: int | None = None
    already_ended: bool = False
    was_queued: bool = False
    survivors: tuple = each(ProcessInfo)
    actions: tuple = each()
    refused: tuple = each(Refusal)
    run: RunRecord = of(RunRecord)
    state_error: str | None = None
    extra: dict = extra_keys()


    def record(self) -> RunRecord:
        """The run's record as the kill left it: the answer's own state, signal and exit code over the record's."""
        return replace(self.run, run_id=self.run.run_id or self.run_id, state=self.state or self.run.state,
                       signal=self.signal if self.signal is not None else self.run.signal,
                       exit_code=self.exit_code if self.exit_code is not None else self.run.exit_code)


@dataclass(frozen=True)
class KillAnswer(WireRecord):
    """kill: one KilledRun per run asked for; ok when nothing of any of them survived."""

    SKIP_NONE = FAILURE

    ok: bool = False
    runs: tuple = each(KilledRun)
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class RelaunchAnswer(WireRecord):
    """relaunch: the new run, the lost one it continues, the lost run's processes ended first, and whether and
    from where it resumes; failed: code not_relaunched, already_relaunched (`relaunched_as`), survivors_left
    (`survivors`), or a launch's."""

    SKIP_NONE = FAILURE + ("run", "namesakes", "relaunched_as", "survivors")

    ok: bool = False
    run: RunRecord | None = of(RunRecord, optional=True)
    relaunched_from: str | None = None
    lost: str | None = None
    survivors_ended: tuple = each()
    resume_args: tuple = each()
    resumes_from: str | None = None
    namesakes: tuple | None = each(optional=True)
    error: str | None = None
    code: str | None = None
    relaunched_as: str | None = None
    survivors: tuple | None = each(optional=True)
    extra: dict = extra_keys()


@dataclass(frozen=True)
class LinesAnswer(WireRecord):
    """lines: lines [start, start + len(lines)) of a run's log, as a terminal shows them, of `total`."""

    SKIP_NONE = FAILURE

    ok: bool = False
    run_id: str | None = None
    total: int = 0
    start: int = 0
    lines: tuple = each()
    size: int = 0
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class NetInfo(WireRecord):
    """netinfo: this side's address and interface toward an address, its hostname, and a TCP port free here
    (with --free-port)."""

    SKIP_NONE = FAILURE + ("port",)

    ok: bool = False
    toward: str | None = None
    address: str | None = None
    interface: str | None = None
    hostname: str | None = None
    port: int | None = None
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


__all__ = ["CheckAnswer", "CheckResult", "KillAnswer", "KilledRun", "LaunchAnswer", "LinesAnswer", "NetInfo",
           "ProcessInfo", "PsAnswer", "Refusal", "RelaunchAnswer", "SkippedRunDir"]
