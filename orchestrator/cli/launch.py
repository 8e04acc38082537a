"""`dflashctl launch TARGET [options] [-- CMD...]`."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional

import typer

from dflash_records.protocol import DEFAULT_GRACE_S, LIVE_STATES, QUEUED, TERMINAL_STATES
from dflash_records.restart import BACKOFF_MAX_S, parse_policy, policy_text
from dflash_records.run import RunRecord

from ..display import record_state_text
from ..errors import EXIT_OK, DflashError, UsageError, shorten
from ..inventory.model import Target
from ..runs.client import LaunchFailed, LaunchUnverified, RunClient
from ..runs.command import CONFIG_INPUT, config_base_dir, runs_bundled_trainer, train_command
from ..runs.doctor import OK, WARN, preflight, read_needs, refuse_failed
from ..runs.jobs import DEFAULT_DIST_TIMEOUT_S, JobLaunchFailed, JobSpec, launch_job, processes_per_node
from ..runs.placement import Placement
from ..runs.spec import LaunchSpec, check_name, default_name
from ..runs.trainerconfig import config_file, read_config
from ..transports.pool import Connections
from .anywhere import check_anywhere, launch_anywhere
from .args import number_in, parse_env, parse_gpus
from .launcheach import launch_each, split_targets
from .launchqueue import GPU_COUNT_OPTION, QUEUE_OPTION, check_gpu_count, queue_options, queued_line
from .launchreport import interrupted, report_failure
from .output import print_json, stderr
from .state import AppState
from .usage import words_after_dashes

CHECKED_SETTLE_S = 0.5   # a trainer run whose config passed the trainer's check must stay up this long


def restart_policy(text: str | None) -> str | None:
    """--restart, checked as it is parsed (a usage error with the usage line; the value named once, by the
    policy's own message)."""
    if text is None:
        return None
    try:
        return policy_text(parse_policy(shorten(text, 40)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


RESTART_OPTION = typer.Option(
    None, "--restart", callback=restart_policy, metavar="never|on-failure[:N]",
    help="After a failed or hung attempt, start the run again (at most N times; 3 without N), after 10 s, "
         "then 20 s, ... up to 5 min; the bundled trainer resumes from its newest complete checkpoint. "
         "The supervisor does it inside the container, with no dflashctl running. Default: the inventory's "
         "`restart:` of the container, host or defaults, else never.")
RESTART_BACKOFF_OPTION = typer.Option(
    None, "--restart-backoff", callback=number_in(0, BACKOFF_MAX_S), metavar="S",
    help=f"Seconds before the first restart, doubling after each, at most {BACKOFF_MAX_S:g} (default 10).")
HANG_TIMEOUT_OPTION = typer.Option(
    None, "--hang-timeout", callback=number_in(0), metavar="S",
    help="An attempt that printed step lines and then none for S seconds is hung: its Python stacks go to "
         "its log, it is ended and (under --restart) started again. Default: 20 times its median step "
         "interval, at least 10 min; 0: never.")
GPUS_OPTION = typer.Option(None, "--gpus", metavar="0,1|0-7|none",
                           help="GPUs of the target the run may use (sets CUDA_VISIBLE_DEVICES); none: it uses no "
                                "GPU and holds none (a notifier, a data job).")
FORCE_OPTION = typer.Option(False, "--force", help="Start even if a live run holds the GPUs, or doctor's checks of "
                                                   "the config fail (tmpfs paths, no room, no GPU).")
NPROC_OPTION = typer.Option(None, "--nproc-per-node", callback=number_in(1), metavar="N",
                            help="Processes per node of a multi-target job (default: one per GPU; one CPU process "
                                 "where there are none or the config says cpu).")
DIST_TIMEOUT_OPTION = typer.Option(
    DEFAULT_DIST_TIMEOUT_S, "--dist-timeout", callback=number_in(1), metavar="SECONDS",
    help="Multi-target job: how long the rendezvous and every collective wait for a missing node before the job "
         "fails.")
EACH_OPTION = typer.Option(False, "--each", help="One run on each TARGET (the leading arguments that name targets; "
                                                 "CMD after them), all launched at once by this process.")
ANYWHERE_OPTION = typer.Option(
    False, "--anywhere", help="Let the fleet choose the target: where --gpu-count GPUs are free now (packing onto "
    "partly used containers first), else where the queue is shortest; the run is queued there. Says where and why.")
HOSTS_OPTION = typer.Option(None, "--hosts", metavar="PATTERN", help="With --anywhere: only the targets whose "
                            "name or host matches this glob (pve*, pve1/*).")
COMMAND_ARGUMENT = typer.Argument(None, metavar="[TARGET...] | [-- CMD...]", help=(
    "With --config: more targets, one job across all of them. Without: run this command instead of the bundled "
    "trainer."))
CONFIG_OPTION = typer.Option(None, "--config", "-c", metavar="FILE", help="Trainer config (YAML) for the bundled "
                             "trainer.")
GRACE_OPTION = typer.Option(DEFAULT_GRACE_S, "--grace", callback=number_in(0), metavar="S",
                            help="Seconds a later `kill` waits after TERM.")


def launch(
    ctx: typer.Context,
    target: Optional[str] = typer.Argument(None, metavar="TARGET", help="HOST/CTID, HOST or local."),
    command: Optional[List[str]] = COMMAND_ARGUMENT,
    name: Optional[str] = typer.Option(None, "--name", "-n", metavar="NAME", help="Run name (default: from the command)."),
    config: Optional[Path] = CONFIG_OPTION,
    gpus: Optional[str] = GPUS_OPTION,
    env: Optional[List[str]] = typer.Option(None, "--env", "-e", metavar="K=V", help="Extra environment (repeat)."),
    force: bool = FORCE_OPTION,
    grace: float = GRACE_OPTION,
    nproc_per_node: Optional[int] = NPROC_OPTION,
    dist_timeout: float = DIST_TIMEOUT_OPTION,
    restart: Optional[str] = RESTART_OPTION,
    restart_backoff: Optional[float] = RESTART_BACKOFF_OPTION,
    hang_timeout: Optional[float] = HANG_TIMEOUT_OPTION,
    queue: Optional[bool] = QUEUE_OPTION,
    each: bool = EACH_OPTION,
    anywhere: bool = ANYWHERE_OPTION,
    hosts: Optional[str] = HOSTS_OPTION,
    gpu_count: Optional[int] = GPU_COUNT_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the run record (a job: job_id and one per node)."),
) -> int:
    """Start a run detached under a supervisor so it survives the SSH session, pct and this command (or, with
    --queue, have it wait in the container's queue while its GPUs are held).

    Without CMD, deploys the bundled DFlash trainer (once per version) and runs it with --config (under torchrun
    when the run has several GPUs). Returns once the run is verified running and prints its run id; one that ends
    meanwhile: exit 1, its exit code and log's last lines; one not seen running in time is left running, exit 3.

    With --config and several TARGETs, starts one job across them: torchrun (c10d rendezvous on the first
    target, at its inventory address) under a supervisor on every target, node 0 holding rank 0; every
    target is deployed before any starts. A node that dies takes the job to `failed` on every node.

    Examples (demo.yaml: what `dflashctl demo` writes; qwen36.yaml: docs/trainer.md's Qwen3.6-27B recipe):

        dflashctl launch local --config ~/.local/share/dflashctl/demo/demo.yaml
        dflashctl launch pve1/200 --config qwen36.yaml --gpus 0-7
        dflashctl launch pve1/200 pve2/300 --config qwen36.yaml --gpus 0-7
        dflashctl launch local --name sweep1 -- python train.py --lr 3e-4
        dflashctl launch --anywhere --hosts 'pve*' --gpu-count 1 --config qwen36.yaml
    """
    state: AppState = ctx.obj
    words = [w for w in (target, *(command or [])) if w is not None]
    healing = {"restart": restart, "restart_backoff": restart_backoff, "hang_timeout": hang_timeout}
    if anywhere or hosts is not None:
        options = dict(name=name, config=config, env=parse_env(env), force=force, grace=grace)
        return _launch_anywhere(state, ctx, words, dict(anywhere=anywhere, gpus=gpus, each=each), hosts=hosts,
                                gpu_count=gpu_count, healing=healing, options=options, as_json=as_json)
    cut = _command_start(words, words_after_dashes(ctx, words), each=each, config=config)  # checks it early
    gpu_list = parse_gpus(gpus)
    waiting = queue_options(gpus=gpu_list, force=force, queue=queue, gpu_count=gpu_count,
                            job=bool(config and command and not each))
    options = dict(name=name, config=config, gpus=gpu_list, env=parse_env(env), force=force, grace=grace)
    if each:
        return _launch_each(state, words, cut, {**options, **waiting}, healing, as_json=as_json)
    if config is not None and command:
        spec = job_spec(_job_targets(state, words), **options, nproc_per_node=nproc_per_node, dist_timeout=dist_timeout)
        return _launch_job(state, _healed(spec, healing), config, as_json=as_json)
    spec = _healed(launch_spec(state.inventory().target(words[0]), words[1:], **options, **waiting), healing)
    return _launch_run(state, spec, config, as_json=as_json)


def _command_start(words: list[str], after: int | None, *, each: bool, config: Path | None) -> int | None:
    """Where CMD begins among TARGET and the words after it: at `--` when it was given (everything after it is
    the command, even a word that names a host), None without it. Checked before anything is contacted."""
    if not words:
        raise UsageError("no TARGET: dflashctl launch TARGET [options] [-- CMD...], or --anywhere --gpu-count N")
    if after is None:
        return None
    if after == 0:
        raise UsageError("no TARGET before `--`: dflashctl launch TARGET [TARGET... --each] -- CMD...")
    if after > 1 and not each and config is None:
        raise UsageError(f"{after} TARGETs before `--` ({shorten(' '.join(words[:after]), 80)}): a command runs "
                         f"on one TARGET; --each starts it on each of them")
    return after


def _launch_anywhere(state: AppState, ctx: typer.Context, words: list[str], placing: dict, *, hosts: str | None,
                     gpu_count: int | None, healing: dict, options: dict, as_json: bool) -> int:
    """--anywhere: checked before anything is asked, then placed and launched queued (anywhere.py)."""
    argv = check_anywhere(words=words, cut=words_after_dashes(ctx, words), gpu_count=gpu_count, **placing)
    queue_options(gpus=None, gpu_count=gpu_count, queue=True, force=options["force"], job=False)
    return launch_anywhere(state.inventory(), hosts=hosts, gpu_count=gpu_count,
                           spec_for=lambda where: _healed(launch_spec(where, argv, gpus=None, **options), healing),
                           launch_run=lambda spec, **how: _launch_run(state, spec, options["config"],
                                                                      as_json=as_json, **how))


def _healed(spec, healing: dict):
    """The spec (a run's or a job's) with the restart policy, its backoff and the hang watchdog's bound."""
    spec.restart, spec.restart_backoff, spec.hang_timeout = healing.values()
    return spec


def _launch_each(state: AppState, words: list[str], cut: int | None, options: dict, healing: dict, *,
                 as_json: bool) -> int:
    """--each: one run on each of the leading words that name targets (every word before `--`), CMD the words
    after them."""
    targets, argv = split_targets(state, words, cut)
    specs = [_healed(launch_spec(target, argv, **options), healing) for target in targets]
    return launch_each(state, specs, as_json=as_json, preflight=lambda client, chosen: _preflight(
        client, chosen, options["config"], force=options["force"]))


def _preflight(client: RunClient, targets: list[Target], config: Path | None, *, force: bool) -> None:
    """doctor's checks of what the config needs, on every target before anything starts: a fail refuses the
    launch (exit 2) unless --force, which only reports it."""
    if config is None:
        return
    needs = read_needs(config)
    for target in targets:
        rows = preflight(client, target, needs)
        for row in rows:
            if row.status != OK and (force or row.status == WARN):
                stderr().print(f"{target.name}: {row.status}: {row.line()}", markup=False)
        if not force:
            refuse_failed(target, rows)


def _warn_same_name(client: RunClient, targets: list[Target], name: str) -> None:
    """Say so when a live run on these targets already has the name: `kill NAME` will then refuse to guess
    between them (give the id). Only the launch's own targets are asked; one that cannot be read is left to
    the launch to report. (A single run's launch has its agent say it instead: `_say_namesakes`.)"""
    same = []
    for target in targets:
        try:
            same += [r.run_id for r in client.runs_on(target) if r.name == name and r.state in LIVE_STATES]
        except DflashError:
            continue
    _say_namesakes(same, name)


def _say_namesakes(same: list[str], name: str) -> None:
    if same:
        stderr().print(f"warning: a live run is already named {name!r}: {', '.join(same)}; `dflashctl kill "
                       f"{name}` will ask which one (give the id, or launch with another --name)", markup=False)


def _launch_run(state: AppState, spec: LaunchSpec, config: Path | None, *, as_json: bool,
                conns: Connections | None = None, placement: Placement | None = None) -> int:
    """Launch one run and say what became of it; over `conns` where they are open already (--anywhere's, which
    also gives its `placement` to --json)."""
    err = stderr()
    where = spec.target.name
    err.print(f"launching {spec.name} on {where}...")
    if spec.gpus is None and spec.gpu_count is None and spec.target.gpus:
        err.print(f"no --gpus: the run sees all {spec.target.gpus} GPUs of {where} and holds them all "
                  f"(a launch there that names GPUs is refused while it lives, unless --force; "
                  f"--gpus none for a run that uses no GPU)", markup=False)
    client = None
    try:
        with nullcontext(conns) if conns is not None else Connections() as open_conns:
            client = RunClient(state.inventory(), open_conns)
            _preflight(client, [spec.target], config, force=spec.force)
            record = _launched(client, spec, as_json=as_json)
            run_id = record.run_id
            _say_namesakes(client.namesakes.get(run_id, []), spec.name)
    except KeyboardInterrupt:
        interrupted(client)
    if as_json:
        where_and_why = {"placement": placement.to_dict()} if placement is not None else {}
        print_json({"run": record.to_dict(), **record.to_dict(), **where_and_why})
    else:
        err.print(_started_line(record, where), markup=False)
        typer.echo(run_id)
    return EXIT_OK


def _launched(client: RunClient, spec: LaunchSpec, *, as_json: bool) -> RunRecord:
    """The run's record; a run that ended during its launch shows its log's end, one started but not seen
    running in time is printed as a started one is (its id on stdout) before its error (exit 3)."""
    try:
        return client.launch(spec)
    except LaunchFailed as failed:
        report_failure(failed)
        raise
    except LaunchUnverified as unverified:
        if as_json:
            print_json({"run": unverified.run.to_dict(), **unverified.run.to_dict(), "verified": False})
        else:
            typer.echo(unverified.run_id)
        raise


def _started_line(record: RunRecord, where: str) -> str:
    """What became of the run: running, queued, or (a short command) already ended while the launch verified it."""
    run_id = record.run_id
    if record.state == QUEUED:
        return queued_line(record, where)
    if record.state in TERMINAL_STATES:
        return (f"{run_id} on {where} already ended: {record.ended_text()}; `dflashctl logs {run_id}` shows its "
                f"output")
    pid = f" (pid {record.pid})" if record.pid else ""
    return (f"{run_id} is {record_state_text(record)} on {where}{pid}; "
            f"`dflashctl logs -f {run_id}` to follow it")


def _job_targets(state: AppState, names: list[str]) -> list[Target]:
    targets = []
    for name in names:
        try:
            targets.append(state.inventory().target(name))
        except UsageError as exc:
            raise UsageError(f"{exc} (with --config every argument is a TARGET of one job: give either "
                             f"--config (the bundled trainer) or -- CMD (your own command), not both)") from None
    return targets


def _launch_job(state: AppState, spec: JobSpec, config: Path, *, as_json: bool) -> int:
    err = stderr()
    err.print(f"launching job {spec.name} on {', '.join(t.name for t in spec.targets)}...", markup=False)
    client = None
    try:
        with Connections() as conns:
            client = RunClient(state.inventory(), conns)
            _preflight(client, spec.targets, config, force=spec.force)
            _warn_same_name(client, spec.targets, spec.name)
            try:
                job = launch_job(client, spec)
            except JobLaunchFailed as failed:
                if failed.answer is not None:
                    report_failure(LaunchFailed(failed.answer, "node"))
                raise
    except KeyboardInterrupt:
        interrupted(client)
    if as_json:
        print_json(job.to_dict())
        return EXIT_OK
    for node in job.nodes:
        err.print(f"  node {node.node_rank}: {node.run_id} {node.state} on {node.target} (pid {node.pid})",
                  markup=False)
    err.print(f"job {job.job_id}: rendezvous at {job.rendezvous}; `dflashctl logs -f {job.job_id}` "
              f"follows node 0", markup=False)
    typer.echo(job.job_id)
    return EXIT_OK


def job_spec(targets: list[Target], config: Path, *, name: str | None, gpus: list[int] | None,
             env: dict[str, str], force: bool, grace: float, nproc_per_node: int | None,
             dist_timeout: float) -> JobSpec:
    """A multi-node job of the bundled trainer; --gpus is checked against every target here, the config on
    every target by the trainer itself before any node starts."""
    specs = [launch_spec(target, [], name=name, config=config, gpus=gpus, env=env, force=force, grace=grace)
             for target in targets]
    text = specs[0].inputs[CONFIG_INPUT]
    cpu_only = read_config(config, text).get("device") == "cpu"
    return JobSpec(targets=targets, config_text=text, config_source=str(config),
                   name=check_name(name or config.stem.replace(" ", "-")), gpus=gpus,
                   nproc_per_node=nproc_per_node, cpu_only=cpu_only, env=env, force=force, grace=grace,
                   dist_timeout=dist_timeout)


def launch_spec(target: Target, command: list[str], *, name: str | None, config: Path | None,
                gpus: list[int] | None, env: dict[str, str], force: bool, grace: float, queue: bool | None = None,
                gpu_count: int | None = None) -> LaunchSpec:
    """What to start for `launch`: CMD as given, or the bundled trainer with the config; queued (`queue`; None:
    the inventory's `queue:`) where its GPUs are held, on any `gpu_count` free GPUs where that is given."""
    spec = _what_to_start(target, command, name=name, config=config, gpus=gpus, env=env, force=force, grace=grace,
                          gpu_count=gpu_count)
    spec.queue, spec.gpu_count = queue, gpu_count
    return spec


def _what_to_start(target: Target, command: list[str], *, name: str | None, config: Path | None,
                   gpus: list[int] | None, env: dict[str, str], force: bool, grace: float,
                   gpu_count: int | None) -> LaunchSpec:
    if command and config:
        raise UsageError("give either --config (the bundled trainer) or -- CMD (your own command), not both")
    if gpus is not None and target.gpus and any(g >= target.gpus for g in gpus):
        raise UsageError(f"--gpus {shorten(','.join(map(str, gpus)), 60)}: {target.name} has {target.gpus} GPU(s) "
                         f"(0-{target.gpus - 1}) in the inventory")
    check_gpu_count(target.name, target.gpus, gpu_count)
    if command:
        return LaunchSpec(target=target, command=command, name=check_name(name or default_name(command)),
                          env=env, gpus=gpus, force=force, grace=grace,
                          uses_trainer=runs_bundled_trainer(command))
    if config is None:
        raise UsageError("nothing to run: give --config FILE for the bundled trainer, or -- CMD")
    return _trainer_spec(target, config, name=name, gpus=gpus, env=env, force=force, grace=grace,
                         gpu_count=gpu_count)


def _trainer_spec(target: Target, config: Path, *, name: str | None, gpus: list[int] | None,
                  env: dict[str, str], force: bool, grace: float, gpu_count: int | None) -> LaunchSpec:
    text, _ = config_file(config)
    base_dir = config_base_dir(target, str(config))
    nproc = gpu_count or processes_per_node(target, gpus)  # --gpu-count N: one process on each of its N GPUs
    command = train_command(target, nproc=nproc, base_dir=base_dir)
    # The keys, the paths, the data and the python's packages are checked by the trainer itself on the target,
    # all in one pass, before the run is created. What a settle of 1 s would catch on top of that (the trainer
    # not starting at all) that check has shown already: the same python, PYTHONPATH and package ran it.
    return LaunchSpec(target=target, command=command, name=check_name(name or config.stem.replace(" ", "-")),
                      env=env, gpus=gpus, force=force, grace=grace, inputs={CONFIG_INPUT: text},
                      uses_trainer=True, check_config=str(config), config_base=base_dir, settle=CHECKED_SETTLE_S)
