"""`dflashctl doctor`: can we reach each target, and does it have what a run needs?

basics.py reaches the target (login, pct, container, python, nvidia-smi); facts.py then reads the host (kernel
module, device majors, `pct config`) and asks the agent's probe about the container; checks.py lists the
checks that judge those facts, one Row each (ok / warn / fail, the fix in one line). With a trainer config
(`--config`) the config's checks join in; `launch --config` runs them first (preflight).
"""
from __future__ import annotations

import time

from ...errors import DflashError, OperationFailed, UsageError, Unreachable
from ...inventory.model import Target
from ..client import RunClient
from ..trainerconfig import ConfigRejected
from . import basics, ownfiles
from .checks import CHECKS, CONTAINER_CHECKS, GPU_CHECKS, PREFLIGHT, PREFLIGHT_GPU, run_checks
from .facts import Needs, gather, read_needs
from .report import FAIL, OK, WARN, DoctorReport, Row

__all__ = ["DoctorReport", "Row", "Needs", "check_target", "preflight", "read_needs", "refuse_failed",
           "OK", "WARN", "FAIL"]


def check_target(client: RunClient, target: Target, needs: Needs | None = None) -> DoctorReport:
    report = DoctorReport(target.name)
    started = time.monotonic()
    try:
        _reach(client, target, report)
        _judge(client, target, report, needs)
    except basics.Stop as stop:
        report.error = str(stop)
    except Unreachable as exc:  # the link died between checks
        report.error, report.unreachable = str(exc), True
    except DflashError as exc:
        report.error = str(exc)
    if report.error is not None:
        report.add(Row("reach", FAIL, report.error))
    failed = report.failed()
    report.ok = report.error is None and not failed
    if report.error is None and failed:
        report.error = failed[0].line()
    report.elapsed_ms = round((time.monotonic() - started) * 1000)
    return report


def _reach(client: RunClient, target: Target, report: DoctorReport) -> None:
    conns = client.conns
    basics.check_login(conns, target, report)
    if target.ctid is not None:
        basics.check_container(conns.host_transport(target.host), target, report)
    transport = conns.for_target(target)
    basics.check_python(transport, target, report)
    where = f"container {target.ctid} running, " if target.ctid is not None else ""
    report.add(Row("reach", OK, f"{where}python {report.python}"))
    basics.measure_cache(transport, target, report)
    ownfiles.check_agent(transport, target, report)
    basics.check_gpus(transport, target, report)


def _judge(client: RunClient, target: Target, report: DoctorReport, needs: Needs | None) -> None:
    facts = gather(client, target, smi_gpus=report.gpus if report.nvidia_smi else None, needs=needs)
    ownfiles.check_free_space(client.conns.for_target(target), target, report, facts.probe.workdir)
    if facts.probe_error:
        report.add(Row("probe", FAIL, f"the agent's probe did not run: {facts.probe_error}",
                       f"check that {target.workdir} is writable on {target.name}"))
    checks = CHECKS if needs is not None else GPU_CHECKS + CONTAINER_CHECKS
    for row in run_checks(facts, checks):
        report.add(row)
    if needs is not None and not facts.probe_error:
        for row in trainer_check(client, target, needs):
            report.add(row)


def trainer_check(client: RunClient, target: Target, needs: Needs) -> list[Row]:
    """The bundled trainer's own check of the config there, as `launch --config` runs it first: its keys and
    values, the paths and data it names, the python's packages. One fail row per problem it finds."""
    try:
        found = client.check_trainer_config(target, needs.text, source=needs.source, env={})
    except ConfigRejected as rejected:
        return [Row("trainer check", FAIL, problem, f"correct {needs.source}") for problem in rejected.problems]
    except OperationFailed as exc:
        return [Row("trainer check", FAIL, str(exc), "install the trainer's packages in the target's python")]
    return [Row("trainer check", OK, f"a {found.get('target_layers')}-layer target tapped at "
                                     f"{found.get('target_layer_ids')}, {found.get('data_files')} data file(s)")]


def preflight(client: RunClient, target: Target, needs: Needs) -> list[Row]:
    """What `launch --config` checks first: the config's rows, the workdir's, and (unless the config runs on
    the CPU) the GPU rows; one host round trip and one probe."""
    facts = gather(client, target, smi_gpus=None, needs=needs, with_host=not needs.cpu_only)
    if facts.probe_error:
        return []  # the launch itself reports a target it cannot run the agent on
    return run_checks(facts, PREFLIGHT + (() if needs.cpu_only else PREFLIGHT_GPU))


def refuse_failed(target: Target, rows: list[Row]) -> None:
    """A launch's preflight found fail rows: refuse with them (exit 2)."""
    failed = [row for row in rows if row.status == FAIL]
    if failed:
        lines = "\n".join(f"  {row.line()}" for row in failed)
        raise UsageError(f"{target.name}: doctor found {len(failed)} problem(s), nothing was started "
                         f"(--force launches anyway):\n{lines}")
