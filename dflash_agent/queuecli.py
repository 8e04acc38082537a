"""The queue's part of the agent's command line: `launch --queue [--gpu-count N]`, `queue`, `start-queued`
(internal: the keeper's starter of a run whose turn came) and `resume` (internal: the boot unit's command,
bootunit.py). What each does: queuelaunch.py."""
from __future__ import annotations

import argparse

from dflash_records.protocol import BAD_USAGE

from .argtypes import seconds
from .errors import BadInput


def add_queue_options(launch: argparse.ArgumentParser) -> None:
    launch.add_argument("--queue", action="store_true",
                        help="when its GPUs are held or runs wait ahead, queue the run instead of refusing it")
    launch.add_argument("--gpu-count", type=int, metavar="N", help="any N free GPUs (with --queue)")


def add_queue_commands(sub) -> None:
    queue = sub.add_parser("queue", help="the container's GPUs and its queued runs in order")
    queue.add_argument("--runs-dir", required=True)
    resume = sub.add_parser("resume", help=argparse.SUPPRESS)  # the boot unit's: start the keeper of a queue
    resume.add_argument("--runs-dir", required=True)
    start = sub.add_parser("start-queued", help=argparse.SUPPRESS)
    start.add_argument("--runs-dir", required=True)
    start.add_argument("--run-id", required=True)
    start.add_argument("--check", metavar="JSON_ARGV")
    start.add_argument("--check-input", metavar="NAME")
    start.add_argument("--verify-timeout", type=seconds, default=10.0)
    start.add_argument("--spawned", action="store_true", help="the keeper started its supervisor: only verify")


def check_queue_args(args: argparse.Namespace) -> None:
    """--queue and --gpu-count of a launch, refused before stdin is read or anything runs where they may not be."""
    if not args.queue and args.gpu_count is None:
        return
    if not args.queue:
        raise BadInput("--gpu-count goes with --queue", code=BAD_USAGE)
    from .queuelaunch import check_gpu_request
    check_gpu_request(args.gpus, args.gpu_count)


def launch_queued(args: argparse.Namespace, req):
    from .precheck import parse_check_argv
    from .queuelaunch import launch_or_queue
    return launch_or_queue(req, verify_timeout=args.verify_timeout, settle=args.settle,
                           check_argv=parse_check_argv(args.check) if args.check is not None else None,
                           check_input=args.check_input)


def queue_command(args: argparse.Namespace):
    from .precheck import parse_check_argv
    from .queuelaunch import queue_answer, resume_at_boot, start_queued
    if args.command == "queue":
        return queue_answer(args.runs_dir)
    if args.command == "resume":
        return resume_at_boot(args.runs_dir)
    return start_queued(args.runs_dir, args.run_id, check_input=args.check_input,
                        check_argv=parse_check_argv(args.check) if args.check is not None else None,
                        verify_timeout=args.verify_timeout, spawned=args.spawned)
