"""`dflashctl launch --anywhere [--hosts PATTERN] --gpu-count N [options] [-- CMD...]`: the fleet picks the target.

Every candidate target (the inventory's, or those `--hosts` matches) is asked for its queue at once, as `ps` asks
for runs; the decision is runs/placement.py's, from those answers alone; the run is then launched queued there
over the connection already open (it starts at once where its GPUs are free, else waits its turn in that
container's queue with no dflashctl running). Where the run went and why is one line on stderr, and `placement`
in --json.
"""
from __future__ import annotations

from dataclasses import replace

from typing import Callable

from ..errors import EXIT_UNREACHABLE, DflashError, Unreachable, UsageError, shorten
from ..inventory.model import Inventory, Target
from ..runs.client import RunClient
from ..runs.placement import Asked, Placement, place
from ..runs.spec import LaunchSpec
from ..transports.fanout import per_target
from ..transports.pool import Connections
from .output import stderr


def check_anywhere(*, words: list[str], cut: int | None, gpu_count: int | None, gpus: str | None, each: bool,
                   anywhere: bool) -> list[str]:
    """CMD of an --anywhere launch (the words after `--`; none with --config), or the usage error that refuses
    it before anything is contacted."""
    if not anywhere:
        raise UsageError("--hosts chooses among the targets of --anywhere: give --anywhere, or name the TARGET")
    if cut is None and words or cut:
        raise UsageError(f"--anywhere chooses the target: give no TARGET ({shorten(' '.join(words[:cut or 1]), 60)});"
                         f" a command goes after `--`")
    if gpu_count is None:
        raise UsageError("--anywhere needs --gpu-count N: the GPUs the run needs, to find a target with N free")
    if gpus is not None:
        raise UsageError("--anywhere places by --gpu-count N; --gpus names GPUs of one TARGET: give one or the other")
    if each:
        raise UsageError("--anywhere places one run; --each starts one on each TARGET named: give one or the other")
    return words


def candidates(inventory: Inventory, hosts: str | None) -> list[Target]:
    """Every target of the inventory, or those `--hosts PATTERN` matches."""
    if hosts is None:
        return inventory.all_targets()
    try:
        return inventory.matching(hosts)
    except UsageError as exc:
        raise UsageError(f"--hosts: {exc}") from None


def decide(client: RunClient, targets: list[Target], gpu_count: int) -> tuple[Placement, Target]:
    """Ask every target for its queue at once (one session each) and place the run from the answers: the
    decision, and its target with the GPU count its agent reported (so the launch need not ask nvidia-smi)."""
    answers = ask(client, targets)
    decision = place(answers, gpu_count)
    return decision, chosen_target(decision, targets, answers)


def ask(client: RunClient, targets: list[Target]) -> dict[str, Asked]:
    """Every target's queue answer (or why it could not be asked), asked at once, one session each."""
    return {o.target.name: o.value if o.ok else _not_asked(o.target, o.error)
            for o in per_target(targets, client.queue)}


def chosen_target(decision: Placement, targets: list[Target], answers: dict[str, Asked]) -> Target:
    """The decision's target, with the GPU count its agent reported where the inventory gives none (so the launch
    need not ask nvidia-smi); a decision of no target is the error that says why (nothing is launched)."""
    if decision.target is None:
        error = Unreachable if any(s.unreachable for s in decision.skipped) else UsageError
        raise error(f"--anywhere: {decision.reason}")
    chosen = {t.name: t for t in targets}[decision.target]
    return chosen if chosen.gpus else replace(chosen, gpus=answers[decision.target].gpus_total)


def launch_anywhere(inventory: Inventory, *, hosts: str | None, gpu_count: int,
                    spec_for: Callable[[Target], LaunchSpec], launch_run: Callable[..., int]) -> int:
    """Place the run, say where and why, and launch it queued there with `launch_run(spec, conns=, placement=)`
    (the single launch's own path, over the connections the decision opened)."""
    targets = candidates(inventory, hosts)
    spec_for(targets[0])  # what to run is checked (a config, a command) before any target is asked
    with Connections() as conns:
        decision, chosen = decide(RunClient(inventory, conns), targets, gpu_count)
        stderr().print(f"placing on {decision.reason}", markup=False)
        spec = spec_for(chosen)
        spec.queue, spec.gpu_count = True, gpu_count
        return launch_run(spec, conns=conns, placement=decision)


def _not_asked(target: Target, error: DflashError) -> str:
    """Why a target's queue could not be read, without its name (the reason line gives it)."""
    text = str(error).removeprefix(f"{target.name}: ")
    return f"unreachable: {text}" if error.exit_code == EXIT_UNREACHABLE else text
