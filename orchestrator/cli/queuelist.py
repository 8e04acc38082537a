"""`dflashctl ps --queue [TARGET...] [--json]`: each target's GPU queue, as its agent answers `queue`.

Per target: its GPUs (free now; held by our runs; held by a process no run owns) and its queued runs in the order
they start, each with what it waits for and since when. Targets are asked in parallel, one agent call each.
"""
from __future__ import annotations

import datetime

from rich.padding import Padding
from rich.table import Table

from dflash_records.queueinfo import QueueAnswer, QueuedRun, ordinal

from ..display import age, index_ranges, waiting_for
from ..inventory.model import Target
from ..runs.client import RunClient
from ..transports.fanout import fanout_exit_code, per_target
from ..transports.pool import Connections
from .output import print_json, say, stderr, stdout
from .state import AppState

COLUMNS = ("#", "RUN", "NAME", "WAITS FOR", "QUEUED")


def show_queues(state: AppState, targets: list[Target], *, as_json: bool) -> int:
    """Print the queues of `targets`; a target not read says why on stderr (and in `--json`), never "empty"."""
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        outcomes = per_target(targets, client.queue)
    if as_json:
        print_json({"targets": {o.target.name: _json(o.value if o.ok else None, o.error) for o in outcomes}})
    now = datetime.datetime.now(datetime.timezone.utc)
    for outcome in outcomes:
        answer = outcome.value if outcome.ok else None
        if answer is None or not answer.ok:
            error = outcome.error if answer is None else answer.error or "the agent could not read the queue"
            stderr().print(f"dflashctl: error: {outcome.target.name}: queue not read: {error}", markup=False)
        elif not as_json:
            _print_queue(outcome.target.name, answer, now)
    return fanout_exit_code(outcomes, lambda answer: answer.ok)


def _json(answer: QueueAnswer | None, error: BaseException | None) -> dict:
    if answer is None:
        return {"ok": False, "error": str(error)}
    return {"error": None, **answer.to_dict()}


def _print_queue(name: str, answer: QueueAnswer, now: datetime.datetime) -> None:
    out = stdout()
    waiting = len(answer.queued)
    say(out, f"{name}: {gpu_summary(answer)}; " + (f"{waiting} queued; {after_reboot(answer)}" if waiting
                                                    else "nothing queued"))
    if not waiting:
        return
    table = Table(box=None, header_style="bold", padding=(0, 2, 0, 0))
    for column in COLUMNS:
        table.add_column(column, no_wrap=True)
    for run in answer.queued:
        table.add_row(*queue_row(run, now))
    out.print(Padding(table, (0, 0, 0, 2), expand=False))


def after_reboot(answer: QueueAnswer) -> str:
    """What a reboot of the container does to its queue: resumed at boot (the agent's systemd unit), or not before
    the next agent call (any dflashctl command that reaches it)."""
    return "resumed at boot" if answer.resumes_at_boot else "after a reboot, resumed at the next dflashctl call"


def gpu_summary(answer: QueueAnswer) -> str:
    """`8 GPUs: free 0,3; our runs hold 1-2,4-7; another process holds 6`, or why they were not read."""
    if answer.gpus_total is None:
        return f"GPUs not read ({answer.gpu_error or 'nvidia-smi gave no answer'})"
    parts = [f"free {_indices(answer.gpus_free)}"]
    if answer.gpus_ours:
        parts.append(f"our runs hold {_indices(answer.gpus_ours)}")
    if answer.gpus_foreign:
        parts.append(f"another process holds {_indices(answer.gpus_foreign)}")
    return f"{answer.gpus_total} GPU{'' if answer.gpus_total == 1 else 's'}: " + "; ".join(parts)


def queue_row(run: QueuedRun, now: datetime.datetime) -> tuple[str, ...]:
    gpus = None if run.gpus is None else list(run.gpus)
    queued = age(run.queued_at, now)
    return (ordinal(run.position), run.run_id, run.name or "-", waiting_for(gpus, run.gpu_count),
            f"{queued} ago" if run.queued_at else queued)


def _indices(indices: tuple) -> str:
    return index_ranges(indices) if indices else "none"
