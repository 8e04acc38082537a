"""`dflashctl sweep CONFIG --set KEY=V1,V2 ... [--anywhere [--hosts PATTERN] | TARGET...]` and `sweep report ID`.

A sweep is checked whole before anything starts: every `--set` (a key of the trainer's config, values given),
the grid's size, each point's config against the trainer's config model here, then each by the trainer's own
check on the target it goes to. One refusal: exit 2 naming the point and the problem, nothing started. Then
every run is launched queued, under one sweep id, each with its own output directory: a grid of more runs than
free GPUs waits in the containers' queues, and each queued run's config is checked again when its turn comes.

Where the runs go: the TARGETs named, in turn; or (`--anywhere`) placed by runs/placement.py from every
candidate's queue answer, asked once, the grid's runs one after the other, each taking its GPUs or a queue place
in the answers the next is placed by (placement.place_each): deterministic given the answers, packed as single
launches would be. Each run's GPUs: `--gpu-count N` (any N free ones; --anywhere needs it), `--gpus` (named), else
as `launch` without them: the run holds every GPU of its target.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dflash_records.protocol import DEFAULT_GRACE_S

from ..errors import EXIT_OK, DflashError, UsageError, shorten, worst_exit_code
from ..inventory.model import Target
from ..runs.client import LaunchFailed, RunClient
from ..runs.command import CONFIG_INPUT
from ..runs.gpucheck import check_gpus
from ..runs.placement import Placement, place_each
from ..runs.spec import LaunchSpec, SweepPlace
from ..runs.sweep import SweepNames, SweepPoint, check_size, config_text, grid, parse_sets
from ..runs.trainerconfig import ConfigRejected, config_file, config_problems, unknown_key
from ..transports.fanout import fanout_exit_code, per_target
from ..transports.pool import Connections
from .anywhere import ask, candidates, chosen_target
from .args import number_in, parse_env, parse_gpus
from .launch import launch_spec
from .launchqueue import queue_options
from .launchreport import interrupted, report_failure
from .output import about, print_json, say, stderr, stdout
from .state import AppState
from .sweepreport import report
from .usage import Command, CommandGroup


class SweepGroup(CommandGroup):
    """`sweep CONFIG ...` is `sweep launch CONFIG ...`: any first word that names no subcommand starts one."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["launch", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(name="sweep", cls=SweepGroup, no_args_is_help=True, rich_markup_mode="markdown",
                  help="Launch a grid of trainer configs as one sweep (`sweep CONFIG --set ...`), and rank its runs "
                       "by τ (`sweep report ID`).")


GPU_COUNT_OPTION = typer.Option(
    None, "--gpu-count", metavar="N", help="GPUs of each run: any N free ones of its target, chosen when it starts "
    "(--anywhere needs it). Default: as launch, each run holds every GPU of its TARGET.")


@app.command("launch", cls=Command)
def launch(
    ctx: typer.Context,
    config: Path = typer.Argument(..., metavar="CONFIG", help="The trainer config (YAML) the grid varies."),
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="Where the runs go, in turn (or --anywhere)."),
    sets: Optional[List[str]] = typer.Option(None, "--set", metavar="KEY=V1,V2",
                                             help="A config key (dotted for a nested one: loss.ce) and its values; "
                                                  "repeat: the grid is every combination."),
    anywhere: bool = typer.Option(False, "--anywhere", help="Place each run on the fleet (every target, or those "
                                                            "--hosts matches) instead of naming TARGETs."),
    hosts: Optional[str] = typer.Option(None, "--hosts", metavar="PATTERN",
                                        help="With --anywhere: only targets whose name or host matches (fnmatch)."),
    name: Optional[str] = typer.Option(None, "--name", "-n", metavar="NAME",
                                       help="The sweep's name (default: the config's file name)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", metavar="0,1|0-7|none", help="GPUs of each run, as launch."),
    gpu_count: Optional[int] = GPU_COUNT_OPTION,
    env: Optional[List[str]] = typer.Option(None, "--env", "-e", metavar="K=V", help="Extra environment (repeat)."),
    grace: float = typer.Option(DEFAULT_GRACE_S, "--grace", callback=number_in(0), metavar="S",
                                help="Seconds a later `kill` waits after TERM."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Start a grid of more than 256 runs."),
    as_json: bool = typer.Option(False, "--json", help="Print the sweep id and every run (or its error)."),
) -> int:
    """Launch the grid of --set values over CONFIG as one sweep, each config checked before any run starts.

    Every --set KEY=V1,V2 is checked against the trainer's config model, every config of the grid by the
    trainer's own check on its target; one refusal and nothing starts (exit 2). Then every run is launched
    queued, under one sweep id, each writing to {output_dir}/{its run name}; the sweep id is printed. Runs
    beyond the free GPUs wait in their containers' queues; each is checked again when its turn comes.

    Examples:

        dflashctl sweep qwen36.yaml --set lr=1e-4,3e-4 --set loss=ce,cap pve1/200 pve2/300
        dflashctl sweep qwen36.yaml --set block_size=8,16 --anywhere --hosts 'pve*' --gpu-count 1 --name bs
        dflashctl sweep report sweep-bs-3f2a1c
    """
    state: AppState = ctx.obj
    axes = parse_sets(list(sets or []), unknown_key)
    check_size(axes, yes=yes)
    gpu_list = parse_gpus(gpus)
    waiting = queue_options(gpus=gpu_list, gpu_count=gpu_count, queue=True, force=False, job=False)
    chosen = _targets(state, list(targets or []), anywhere=anywhere, hosts=hosts, gpu_count=gpu_count)
    _, base = config_file(config)
    names = SweepNames.new(name, config.stem)
    points = grid(base, axes, run_name=names.run_name)
    for point in points:
        _check_locally(config, point)
    options = dict(gpus=gpu_list, env=parse_env(env), force=False, grace=grace, **waiting)
    client = None
    try:
        with Connections() as conns:
            client = RunClient(state.inventory(), conns)
            placements, where = _place(client, chosen, points, gpu_count) if anywhere else _in_turn(chosen, points)
            specs = {p.index: _spec(config, p, names, where[p.index], options) for p in points}
            _say_where(names.sweep_id, points, specs, placements)
            _check_on_targets(client, config, points, specs)
            results = _launch_all(client, specs)
    except KeyboardInterrupt:
        interrupted(client)
    return _report(names.sweep_id, points, specs, results, placements, as_json=as_json)


app.command("report", cls=Command)(report)


def _targets(state: AppState, names: list[str], *, anywhere: bool, hosts: str | None,
             gpu_count: int | None) -> list[Target]:
    """The TARGETs named, or --anywhere's candidates (every target, or those --hosts matches)."""
    inventory = state.inventory()
    if hosts is not None and not anywhere:
        raise UsageError("--hosts chooses among the fleet for --anywhere; give --anywhere too, or name TARGETs")
    if anywhere and names:
        raise UsageError(f"give either TARGETs ({shorten(' '.join(names), 60)}) or --anywhere, not both")
    if not anywhere:
        if not names:
            raise UsageError("where should the runs go? name TARGETs, or --anywhere for the whole fleet")
        return inventory.targets(names)
    if gpu_count is None:
        raise UsageError("--anywhere needs --gpu-count N: the GPUs each run needs, to find targets with N free "
                         "(--gpus names GPUs of TARGETs named)")
    return candidates(inventory, hosts)


def _in_turn(targets: list[Target], points: list[SweepPoint]) -> tuple[dict[int, Placement], dict[int, Target]]:
    """The TARGETs named, in turn: run 1 on the first, run 2 on the second, ..."""
    return {}, {p.index: targets[(p.index - 1) % len(targets)] for p in points}


def _place(client: RunClient, targets: list[Target], points: list[SweepPoint],
           gpu_count: int) -> tuple[dict[int, Placement], dict[int, Target]]:
    """--anywhere: every candidate's queue asked once, then the grid's runs placed one after the other, each
    taking its GPUs or a queue place in the answers the next is placed by; a run no target can take stops the
    sweep before anything starts."""
    answers = ask(client, targets)
    decisions = place_each(answers, [gpu_count] * len(points))
    where = {p.index: chosen_target(d, targets, answers) for p, d in zip(points, decisions)}
    return {p.index: d for p, d in zip(points, decisions)}, where


def _say_where(sweep_id: str, points: list[SweepPoint], specs: dict, placements: dict[int, Placement]) -> None:
    """The sweep's targets, and where each placed run goes and why, one line each."""
    err = stderr()
    shown = list(dict.fromkeys(spec.target.name for spec in specs.values()))
    err.print(f"sweep {sweep_id}: {len(points)} run(s) on {', '.join(shown)}", markup=False)
    for point in points:
        if point.index in placements:
            err.print(f"  {point.label()}: placing on {placements[point.index].reason}", markup=False)


def _check_locally(config: Path, point: SweepPoint) -> None:
    """A point's config against the trainer's config model, here, before any target is asked."""
    problems = config_problems(point.config)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{config} with {point.label()}: {problems[0]}{more}; nothing was started")


def _spec(config: Path, point: SweepPoint, names: SweepNames, target: Target, options: dict) -> LaunchSpec:
    spec = launch_spec(target, [], name=names.run_name(point.index), config=config, **options)
    spec.inputs[CONFIG_INPUT] = config_text(point.config)
    spec.sweep = SweepPlace(names.sweep_id, point.values)
    return spec


def _check_on_targets(client: RunClient, config: Path, points: list[SweepPoint], specs: dict) -> None:
    """The trainer's own check of every point's config on its target, the targets at once; the first refusal
    (or a target not reached) is raised, with nothing started anywhere."""
    by_target: dict[str, list[SweepPoint]] = {}
    for point in points:
        by_target.setdefault(specs[point.index].target.name, []).append(point)

    def check(target: Target) -> None:
        first = specs[by_target[target.name][0].index]  # every run of the sweep asks for the same GPUs
        check_gpus(lambda: client.conns.for_target(target), target, gpus=first.gpus, gpu_count=first.gpu_count)
        for point in by_target[target.name]:
            spec = specs[point.index]
            try:
                client.check_trainer_config(target, spec.inputs[CONFIG_INPUT], source=str(config),
                                            env=spec.run_env())
            except ConfigRejected as exc:
                more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
                raise UsageError(f"{target.name}: {config} with {point.label()}: {exc.problems[0]}{more}; "
                                 f"nothing was started") from None

    chosen = list({specs[p.index].target.name: specs[p.index].target for p in points}.values())
    outcomes = per_target(chosen, check)
    code = fanout_exit_code(outcomes)
    if code != EXIT_OK:  # the worst: a target not reached (3) before a refused config (2)
        raise next(error for error in (o.error for o in outcomes if not o.ok) if error.exit_code == code)


def _launch_all(client: RunClient, specs: dict[int, LaunchSpec]) -> dict[int, object]:
    """index -> the run's record or its error: each target's runs in turn, the targets at once."""
    by_target: dict[str, list[int]] = {}
    for index, spec in specs.items():
        by_target.setdefault(spec.target.name, []).append(index)
    results: dict[int, object] = {}

    def launch_on(target: Target) -> None:
        for index in by_target[target.name]:
            try:
                results[index] = client.launch(specs[index])
            except LaunchFailed as failed:
                report_failure(failed, target.name)
                results[index] = failed
            except DflashError as exc:
                results[index] = exc

    targets = list({spec.target.name: spec.target for spec in specs.values()}.values())
    for outcome in per_target(targets, launch_on):
        for index in by_target[outcome.target.name]:
            if not outcome.ok:
                results.setdefault(index, outcome.error)
    return results


def _report(sweep_id: str, points: list[SweepPoint], specs: dict, results: dict, placements: dict, *,
            as_json: bool) -> int:
    """The sweep id on stdout (with --json the object); each run, or its error, on stderr."""
    err = stderr()
    runs, codes = [], []
    for point in points:
        result, target = results.get(point.index), specs[point.index].target.name
        entry = {"index": point.index, "values": point.values, "target": target}
        if point.index in placements:
            entry["placement"] = placements[point.index].to_dict()
        if isinstance(result, Exception):
            codes.append(getattr(result, "exit_code", 1))
            entry["error"] = str(result)
            say(err, f"dflashctl: error: {point.label()}: " + about(target, str(result)))
        else:
            entry.update(result.to_dict())
            err.print(f"  {point.label()}: {result.run_id} on {target} ({result.state})", markup=False)
        runs.append(entry)
    if as_json:
        print_json({"sweep_id": sweep_id, "runs": runs})
    else:
        stdout().print(sweep_id, markup=False)
        err.print(f"`dflashctl ps --sweep {sweep_id}` lists its runs, `dflashctl sweep report {sweep_id}` ranks "
                  f"them by τ", markup=False)
    return worst_exit_code(codes) if codes else EXIT_OK


__all__ = ["app"]
