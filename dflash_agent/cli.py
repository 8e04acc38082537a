"""The agent's command line: parse, dispatch, print exactly one JSON object, map errors to exit codes.

    launch   --runs-dir D --run-id ID --name N --target T [--cwd DIR] [--env K=V]... [--gpus 0,1] [--force]
             [--grace S] [--verify-timeout S] [--settle S] [--input NAME]...
             [--job-id J --node-rank R --nnodes N] [--sweep-id S --sweep-values JSON] [--keeper-idle S]
             [--restart never|on-failure[:N]] [--restart-backoff S] [--hang-timeout S] [--retry-arg ARG]...
             [--worker-restarts N]
             [--check JSON_ARGV --check-input NAME] [--lease-pkg PKG_DIR] [--queue [--gpu-count N]] -- CMD...
             (with --input, stdin is one JSON object {NAME: base64 content}; each file lands in the run dir;
             with --check, that command runs first in the run's environment with input NAME on its stdin,
             and unless it exits 0 nothing is created)
    check    [--env K=V]... [--pythonpath DIR]... [--gpus 0,1] [--lease-pkg PKG_DIR] -- CMD...
             (CMD in a run's environment with stdin passed on; what launch --check does, on its own)
             --lease-pkg (launch, check): the trainer package leased, or else code needs_deploy, "pkg": "absent"
             (with --queue, a run whose GPUs are held or that has runs queued ahead is queued: see queuelaunch)
    ps       --runs-dir D [--run-id ID]... [--tail-bytes N]
    queue    --runs-dir D                              (the container's GPUs and its queued runs in order)
    kill     --runs-dir D --run-id ID... [--grace S]
    relaunch --runs-dir D --run-id LOST --new-run-id NEW [--job-id J] [--verify-timeout S] [--settle S]
             (a lost run with restarts left, once per loss: a new run of its command that resumes; with --job-id,
             a node of a job the controller relaunches as a whole, as node of job J; see relaunch)
    cleanup  --runs-dir D [--dry-run] [--grace S]
    netinfo  --toward ADDR [--free-port]
    packages --dir PKG_DIR --runs-dir D [--size N --sha256 H [--stall S]]
             (with --size, stdin is the trainer package's tar.gz: installed as PKG_DIR; every time, the other
             versions beside it that no live run uses and none asked for lately are removed; see packages)
    probe    --workdir W --runs-dir D [--path P]... [--node DEV]... [--model DIR]   (doctor's facts, see probe)
    node-watch --stall S -- CMD                        (a job node's workload: CMD's exit, no JSON; see nodewatch)
    watch    --runs-dir D [--gpu-interval S] [--heartbeat S] [--idle-exit S]   (JSON lines, see watchstream)
    lines    --runs-dir D --run-id ID --start S --stop E
    pull-plan --runs-dir D --run-id ID [--checkpoint latest|all|step_N] [--export] [--have NAME=BYTES]...
             (what `dflashctl pull` fetches: files with size and sha256; see pullplan)
    version
    supervise --runs-dir D --run-id ID [--grace S]     (internal: started by the keeper)
    keeper    --runs-dir D [--idle-exit S]             (internal: started by launch; exits after S s idle)
    start-queued --runs-dir D --run-id ID [--check JSON_ARGV --check-input NAME] [--verify-timeout S]
             (internal: started by the keeper when a queued run's turn comes); resume --runs-dir D (the boot unit's)

Every answer (but watch's stream and node-watch's workload) is one line of JSON with "version" (PROTOCOL_VERSION)
and "ok"; exit 0 ok, 1 operation failed, 2 bad input. Each answer below is typed in dflash_records (answers.py,
plans.py), where its fields are described: the agent builds it as that type and serialises it once (`emit`).
Errors: {"ok": false, "error": MESSAGE, "code": CODE, ...details}. Answers (keys may be added, never renamed):
    relaunch {"run": RECORD of the new run, "relaunched_from": LOST, "survivors_ended": [pids of LOST ended first],
             "resume_args", "resumes_from": step_N or null}; failure: code not_relaunched (why) | already_relaunched
             ("relaunched_as") | survivors_left ("survivors": [pids]), or launch's
    launch   {"run": RECORD} (queued: state queued, queue_position); failure: code run_ended | not_verified | gpus_busy
             (+ "busy": {run: [gpus]}),
             with "run", "exit_code", "signal", "log_tail" (last 40 lines), "supervisor_log_tail", "keeper_log_tail";
             or code check_failed with "check": {"exit_code", "stdout", "stderr"}
    check    {"check": {"exit_code", "stdout", "stderr"}}; failure: code check_failed, the same "check"
    netinfo  {"toward", "address", "interface", "hostname" (+ "port": a TCP port free here, with --free-port)}
    packages {"installed": bool, "removed": [names]}; failure: code upload_cut | upload_stalled | upload_damaged |
             unpack_failed
    probe    {"probe": {"devices", "nvml", "limits", "workdir", "shm", "paths", "live_gpus" (+ "model" with --model)}}
    queue    QueueAnswer (dflash_records/queueinfo.py): gpus_total, gpus_free, gpus_ours, gpus_foreign, gpu_error,
             resumes_at_boot, queued: [{"run_id", "position", "name", "gpus", "gpu_count", "queued_at", "sweep_id"}]
    ps       {"runs": [RECORD (+ "log_tail", "metrics_tail": str with --tail-bytes)], "skipped": [{"run_id", "path",
             "points_to", "reason"}] (run directories that are symbolic links: never read or written through)}
    pull-plan {"output_dir", "steps", "checkpoints", "export_dir", "export_ready", "files": [{"source", "dest",
             "size", "sha256", "growing", "manifest" (+ "prefix_size", "prefix_sha256" for a --have)}],
             "skipped": [{"path", "dest", "points_to", "reason"}] (symbolic links: never followed)}; no such
             checkpoint: code bad_usage
    kill     {"runs": [{"run_id", "ok", "state", "signal", "exit_code", "already_ended", "was_queued" (taken out
             of its queue: nothing started), "survivors": [{"pid", "cmdline", "state"}], "actions": [str], "refused": [{"pid", "role", "reason", "process"}]
             (a pid state.json names that is not the run's: never signalled), "run": RECORD (+ "state_error":
             why the end is not in state.json, when even the run's reserve could not make room)}]}
    cleanup  {"dry_run", "actions": [{"action", "done", "ok", "description", ...}], "findings": [{"kind",
             "description", ...}], "foreign_zombies": [{"parent": {"pid", "cmdline", "state"}, "pids", "count",
             "advice", "description"}] (zombies of processes no run owns: never acted on), "gpus": {"available",
             "gpus": [{"index", "memory_used_mib", "utilization_pct"}], "error"}, "live_runs": [run ids]}
RECORD: run_id, target, name, state, pid, pgid, exit_code, signal, signal_name, created_at, started_at, ended_at,
log_path, run_dir, gpus, command, cwd, grace_s, supervisor_pid, supervisor_start_time, error, and for a node of a
multi-node job job_id, node_rank, nnodes, worker_restarts, job_relaunches (null otherwise); attempt, max_attempts,
restart_policy, restart_at, reason, attempts (the supervisor's record of each attempt); relaunch_of (the lost run a
relaunch continues) and relaunched_as (the run that continues a lost one).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from dflash_records.plans import VersionAnswer
from dflash_records.protocol import (AGENT_VERSION, BAD_USAGE, DEFAULT_GRACE_S, EXIT_FAILED, EXIT_OK, INTERNAL_ERROR,
                                     NO_COMMAND, PROTOCOL_VERSION, UPLOAD_STALL_S)

from .argtypes import HelpShown, Parser, backoff_seconds, count, seconds
from .errors import AgentError, BadInput


LEASE_HELP = "the trainer package the workload uses: leased, or the answer says it is absent (needs_deploy)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="agent", description="dflashctl's in-container agent (one JSON object on stdout)")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    _add_launch(sub.add_parser("launch", help="start a supervised run and return once it is verified running"))
    check = sub.add_parser("check", help="run a workload's check in a run's environment; stdin passed on")
    check.add_argument("--env", action="append", default=[], metavar="K=V")
    check.add_argument("--pythonpath", action="append", default=[], metavar="DIR")
    check.add_argument("--gpus")
    check.add_argument("--lease-pkg", metavar="PKG_DIR", help=LEASE_HELP)
    _add_run_commands(sub)
    node_watch = sub.add_parser("node-watch", help="run a job node's torchrun; end it if it outlives its workers")
    node_watch.add_argument("--stall", type=seconds, required=True)
    netinfo = sub.add_parser("netinfo", help="local address and interface toward an address; a free port")
    netinfo.add_argument("--toward", required=True)
    netinfo.add_argument("--free-port", action="store_true")
    pkgs = sub.add_parser("packages", help="install the trainer package on stdin; remove versions nothing uses")
    pkgs.add_argument("--dir", required=True, help="the package's directory, {workdir}/.dflash/pkg/<digest>")
    pkgs.add_argument("--runs-dir", required=True, help="whose live runs keep the versions they use")
    pkgs.add_argument("--size", type=count, help="install: stdin holds this many bytes of tar.gz")
    pkgs.add_argument("--sha256", help="install: their sha256")
    pkgs.add_argument("--stall", type=seconds, default=UPLOAD_STALL_S,
                      help="install: give up after this long without a byte")
    probe = sub.add_parser("probe", help="facts doctor judges: device nodes, driver library, filesystems, limits")
    probe.add_argument("--workdir", required=True)
    probe.add_argument("--runs-dir", required=True)
    probe.add_argument("--path", action="append", default=[], help="a path whose filesystem to report (repeat)")
    probe.add_argument("--node", action="append", default=[], help="a device node expected to be there (repeat)")
    probe.add_argument("--model", help="a model directory: its config.json and size on disk")
    sub.add_parser("version", help="agent and protocol version")
    supervise = sub.add_parser("supervise", help=argparse.SUPPRESS)
    supervise.add_argument("--runs-dir", required=True)
    supervise.add_argument("--run-id", required=True)
    supervise.add_argument("--grace", type=seconds)
    keeper = sub.add_parser("keeper", help=argparse.SUPPRESS)
    keeper.add_argument("--runs-dir", required=True)
    keeper.add_argument("--idle-exit", type=seconds, default=None)
    _add_watch_commands(sub)
    return parser


def _add_launch(launch: argparse.ArgumentParser) -> None:
    launch.add_argument("--runs-dir", required=True)
    launch.add_argument("--run-id", required=True)
    launch.add_argument("--name", required=True)
    launch.add_argument("--target", required=True)
    launch.add_argument("--cwd")
    launch.add_argument("--env", action="append", default=[], metavar="K=V")
    launch.add_argument("--pythonpath", action="append", default=[], metavar="DIR",
                        help="put DIR first on the PYTHONPATH the run inherits (repeat)")
    launch.add_argument("--gpus")
    launch.add_argument("--force", action="store_true", help="start even if a live run holds the GPUs")
    launch.add_argument("--grace", type=seconds, default=DEFAULT_GRACE_S, help="default grace of a kill (s)")
    launch.add_argument("--verify-timeout", type=seconds, default=10.0)
    launch.add_argument("--settle", type=seconds, default=1.0, help="how long the workload must stay up (s)")
    launch.add_argument("--input", action="append", default=[], metavar="NAME",
                        help="a file put into the run directory; stdin is a JSON object NAME -> base64 content")
    launch.add_argument("--job-id", help="the multi-node job this run is one node of")
    launch.add_argument("--node-rank", type=int, help="this node's rank in the job (0 = rendezvous host)")
    launch.add_argument("--nnodes", type=int, help="how many nodes the job has")
    launch.add_argument("--sweep-id", help="the sweep this run is one point of")
    launch.add_argument("--sweep-values", metavar="JSON", help="the values of the sweep's keys it runs (an object)")
    launch.add_argument("--keeper-idle", type=seconds,
                        help="a keeper this launch starts exits after this long with nothing to do (default 600)")
    launch.add_argument("--restart", default="never", metavar="never|on-failure[:N]",
                        help="start the workload again after a failed or hung attempt, at most N times")
    launch.add_argument("--restart-backoff", type=backoff_seconds, metavar="S",
                        help="seconds before the first restart, doubling after each (default 10, capped at 300)")
    launch.add_argument("--hang-timeout", type=seconds, metavar="S",
                        help="end an attempt that printed steps and then none for S s (0: never; default: 20x its "
                             "median step interval, at least 600 s)")
    launch.add_argument("--worker-restarts", type=count, default=0, metavar="N",
                        help="the workload restarts its own workers up to N times (a job node's torchrun): a hung "
                             "attempt has its workers ended, not the workload")
    launch.add_argument("--retry-arg", action="append", default=[], metavar="ARG",
                        help="appended to the command from the second attempt on (repeat)")
    launch.add_argument("--check", metavar="JSON_ARGV",
                        help="run this command first (a JSON list) in the run's environment; create nothing "
                             "unless it exits 0")
    launch.add_argument("--check-input", metavar="NAME", help="the --input the check gets on its stdin")
    launch.add_argument("--lease-pkg", metavar="PKG_DIR", help=LEASE_HELP)
    from .queuecli import add_queue_options
    add_queue_options(launch)



def _add_run_commands(sub) -> None:
    ps = sub.add_parser("ps", help="every run's record")
    ps.add_argument("--runs-dir", required=True)
    ps.add_argument("--run-id", action="append", default=[])
    ps.add_argument("--tail-bytes", type=int, default=0,
                    help="add the last N bytes of each log and metrics.jsonl as log_tail and metrics_tail")
    kill = sub.add_parser("kill", help="end runs completely and verify nothing is left")
    kill.add_argument("--runs-dir", required=True)
    kill.add_argument("--run-id", nargs="+", action="extend", required=True)
    kill.add_argument("--grace", type=seconds)
    relaunch = sub.add_parser("relaunch", help="start a lost run with restarts left again, once per loss")
    relaunch.add_argument("--runs-dir", required=True)
    relaunch.add_argument("--run-id", required=True)
    relaunch.add_argument("--new-run-id", required=True)
    relaunch.add_argument("--job-id", help="relaunch a job's node as the same node of this new job")
    relaunch.add_argument("--verify-timeout", type=seconds, default=10.0)
    relaunch.add_argument("--settle", type=seconds, default=1.0)
    from .queuecli import add_queue_commands
    add_queue_commands(sub)
    cleanup = sub.add_parser("cleanup", help="reap zombies, end orphans, mark dead runs lost, report the rest")
    cleanup.add_argument("--runs-dir", required=True)
    cleanup.add_argument("--dry-run", action="store_true")
    cleanup.add_argument("--grace", type=seconds, default=3.0)
    pull = sub.add_parser("pull-plan", help="the files `dflashctl pull` fetches, with size and sha256")
    pull.add_argument("--runs-dir", required=True)
    pull.add_argument("--run-id", required=True)
    pull.add_argument("--checkpoint", default="latest", help="latest, all or step_N")
    pull.add_argument("--export", action="store_true", help="the checkpoint's export-step_N/ instead of it")
    pull.add_argument("--have", action="append", default=[], metavar="NAME=BYTES",
                      help="a growing file the caller holds this much of: add the hash of that many bytes")


def _add_watch_commands(sub) -> None:
    from .watchstream import HEARTBEAT_S
    watch = sub.add_parser("watch", help="stream run records, log bytes and GPU samples as JSON lines")
    watch.add_argument("--runs-dir", required=True)
    watch.add_argument("--gpu-interval", type=seconds, default=1.0, help="seconds between nvidia-smi samples")
    watch.add_argument("--heartbeat", type=seconds, default=HEARTBEAT_S, help="seconds between heartbeats")
    watch.add_argument("--idle-exit", type=seconds, default=0.0,
                       help="exit when no command came for this long (0 = only when stdin closes)")
    lines = sub.add_parser("lines", help="lines [start, stop) of a run's train.log (sparse index)")
    lines.add_argument("--runs-dir", required=True)
    lines.add_argument("--run-id", required=True)
    lines.add_argument("--start", type=int, required=True)
    lines.add_argument("--stop", type=int, required=True)


def split_command(argv: list) -> tuple:
    """launch's (and node-watch's) CMD is everything after the first `--`, passed on untouched."""
    if argv and argv[0] in ("launch", "node-watch", "check"):
        if "--" not in argv:
            if "-h" in argv or "--help" in argv:
                return argv, []
            raise BadInput("launch needs the command after --", code=NO_COMMAND)
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def dispatch(args: argparse.Namespace, command: list):
    """The subcommand's answer: its type of dflash_records (answers.py, plans.py), or a plain dict for the
    answers only the agent's own callers read (packages, version, keeper, supervise)."""
    # Imported here so that `keeper` and `supervise` load only what they need.
    if getattr(args, "lease_pkg", None) is not None:  # launch and check of a trainer run
        from .packages import lease
        absent = lease(args.lease_pkg, getattr(args, "runs_dir", None))
        if absent is not None:
            return absent
    if getattr(args, "runs_dir", None) and args.command in RESUMERS:
        from .queuelaunch import resume
        resume(args.runs_dir)  # a queue left without its keeper (a reboot) resumes at the next contact
    if args.command == "launch":
        return _launch(args, command)
    if args.command in ("queue", "start-queued", "resume"):
        from .queuecli import queue_command
        return queue_command(args)
    if args.command == "check":
        from .precheck import check_environment, run_check
        from .rundir import parse_env_pairs, parse_gpus
        if not command or not command[0]:
            raise BadInput("check needs the command after --", code=NO_COMMAND)
        env = check_environment(parse_env_pairs(args.env), [os.path.abspath(p) for p in args.pythonpath],
                                parse_gpus(args.gpus) if args.gpus is not None else None)
        from dflash_records.answers import CheckAnswer, CheckResult
        return CheckAnswer(ok=True, check=CheckResult.from_dict(run_check(command, env=env,
                                                                          stdin=sys.stdin.buffer.read())))
    if args.command == "ps":
        from .ps import list_runs
        return list_runs(args.runs_dir, args.run_id, tail=args.tail_bytes)
    if args.command == "kill":
        from .kill import kill_runs
        return kill_runs(args.runs_dir, args.run_id, grace=args.grace)
    if args.command == "relaunch":
        return _relaunch(args)
    if args.command == "cleanup":
        from .cleanup import cleanup
        return cleanup(args.runs_dir, dry_run=args.dry_run, grace=args.grace)
    if args.command == "pull-plan":
        from .pullplan import pull_plan
        return pull_plan(args.runs_dir, args.run_id, checkpoint=args.checkpoint, export=args.export,
                         have=args.have)
    if args.command == "supervise":
        from .supervisor import supervise
        return {"ok": True, "state": supervise(args.runs_dir, args.run_id, grace=args.grace)}
    if args.command == "keeper":
        from .keeper import DEFAULT_IDLE_EXIT_S, run_keeper
        idle = DEFAULT_IDLE_EXIT_S if args.idle_exit is None else args.idle_exit
        return {"ok": run_keeper(args.runs_dir, idle_exit=idle) == 0}
    if args.command == "lines":
        from .lineindex import read_lines
        return read_lines(args.runs_dir, args.run_id, args.start, args.stop)
    if args.command == "netinfo":
        from .netinfo import netinfo
        return netinfo(args.toward, want_port=args.free_port)
    if args.command == "packages":
        from .packages import packages
        return packages(args.dir, args.runs_dir, size=args.size, sha256=args.sha256, stall=args.stall)
    if args.command == "probe":
        from .probe import probe
        return probe(workdir=args.workdir, runs_dir=args.runs_dir, paths=args.path, nodes=args.node,
                     model=args.model)
    if args.command == "version":
        return VersionAnswer(ok=True, agent_version=AGENT_VERSION, python=sys.version.split()[0])
    raise BadInput("no subcommand given (launch, ps, kill, cleanup, version)", code=BAD_USAGE)


RESUMERS = ("launch", "ps", "kill", "queue", "cleanup")


def _launch(args: argparse.Namespace, command: list):
    from .launch import LaunchRequest, job_fields, launch, read_inputs, sweep_fields
    from .queuecli import check_queue_args
    check_queue_args(args)  # before stdin is read or anything runs
    inputs = read_inputs(args.input, sys.stdin.buffer.read()) if args.input else {}
    req = LaunchRequest(runs_dir=args.runs_dir, run_id=args.run_id, name=args.name, target=args.target,
                        command=command, cwd=args.cwd, env_pairs=args.env, gpus=args.gpus, force=args.force,
                        grace=args.grace, inputs=inputs,
                        job=job_fields(args.job_id, args.node_rank, args.nnodes), pythonpath=args.pythonpath,
                        keeper_idle=args.keeper_idle, restart=_restart_fields(args), gpu_count=args.gpu_count,
                        sweep=sweep_fields(args.sweep_id, args.sweep_values))
    if args.check is not None:
        _check_before_launch(req, args.check, args.check_input)
    if args.queue:
        from .queuecli import launch_queued
        return launch_queued(args, req)
    return launch(req, verify_timeout=args.verify_timeout, settle=args.settle)


def _relaunch(args: argparse.Namespace):
    from .relaunch import relaunch
    return relaunch(args.runs_dir, args.run_id, args.new_run_id, verify_timeout=args.verify_timeout,
                    settle=args.settle, new_job_id=args.job_id)


def _restart_fields(args: argparse.Namespace) -> dict:
    """run.json's restart fields of a launch: the policy (checked), its backoff, the watchdog, the retry arguments."""
    from dflash_records.restart import parse_policy
    try:
        policy = parse_policy(args.restart)
    except ValueError as exc:
        raise BadInput("--restart: {}".format(exc), code=BAD_USAGE)
    return {"restart": policy, "restart_backoff_s": args.restart_backoff, "hang_timeout_s": args.hang_timeout,
            "retry_args": list(args.retry_arg), "worker_restarts": args.worker_restarts, "settle_s": args.settle}


def _check_before_launch(req, check: str, input_name: str | None) -> None:
    from .precheck import check_environment, parse_check_argv, run_check
    argv = parse_check_argv(check)
    if input_name is not None and input_name not in req.inputs:
        raise BadInput("--check-input {!r} is not one of the --input names".format(input_name), code="bad_check")
    stdin = req.inputs[input_name] if input_name is not None else b""
    run_check(argv, env=check_environment(req.env, req.pythonpath, req.gpus), stdin=stdin)


STREAMS = ("node-watch", "watch")


def run_stream(args: argparse.Namespace, command: list) -> int:
    """`watch` (JSON lines until stdin closes) and `node-watch` (a job node's workload: CMD's exit)."""
    if args.command == "watch":
        from .queuelaunch import resume
        from .watchstream import watch
        resume(args.runs_dir)
        return watch(args.runs_dir, gpu_interval=args.gpu_interval, idle_exit=args.idle_exit,
                     heartbeat=args.heartbeat)
    from .nodewatch import node_watch
    return node_watch(command, stall=args.stall)


def emit(payload) -> None:
    """The one line of JSON of an answer: a typed one serialised here, once."""
    out = {"version": PROTOCOL_VERSION}
    out.update(payload.to_dict() if hasattr(payload, "to_dict") else payload)
    sys.stdout.write(json.dumps(out, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        head, command = split_command(argv)
        args = build_parser().parse_args(head)
        if args.command in STREAMS:  # not a request: no answer object, the exit status says how it ended
            return run_stream(args, command)
        result = dispatch(args, command)
    except HelpShown:
        emit({"ok": True, "help": "shown on stderr"})
        return EXIT_OK
    except AgentError as exc:
        payload = {"ok": False, "error": str(exc), "code": exc.code}
        payload.update(exc.details)
        emit(payload)
        return exc.exit_status
    except Exception as exc:  # noqa: BLE001 - the caller must always get one JSON object
        traceback.print_exc()
        emit({"ok": False, "error": "{}: {}".format(type(exc).__name__, exc), "code": INTERNAL_ERROR})
        return EXIT_FAILED
    emit(result)
    ok = result.ok if hasattr(result, "ok") else result.get("ok")
    return EXIT_OK if ok else EXIT_FAILED
