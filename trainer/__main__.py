"""`python -m trainer COMMAND`: train, check, export, prepare, generate, eval, tiny-target.

Exit codes: 0 success; 1 an unexpected error (full traceback printed), or a checkpoint that found the disk full
(one `error:` line); 2 bad input (a TrainerError: the message only, one `error:` line per problem). SIGTERM keeps
its default action, so the process ends at once; the supervisor that started it owns the grace period. SIGUSR1
dumps every thread's stack into the log.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import traceback

from trainer.errors import TrainerError, about_path


def _train(args) -> int:
    if args.plan:
        return _plan(args)
    from trainer.training.startup import default_cuda_allocator, restarted_resume

    default_cuda_allocator()  # before torch loads and anything touches the GPU
    from trainer.train import main as train_main

    return train_main(args.config, resume=args.resume or restarted_resume(), base_dir=args.base_dir)


def _plan(args) -> int:
    """`train --plan`: the plan of one rank of a run on --gpus GPUs (default: WORLD_SIZE, else 1) of --gpu-memory
    GiB each (default: this machine's first GPU, else unchecked), loading nothing; exit 0 when it fits, 2 (a
    TrainerError) when not. The kernels are the ones the run would resolve on a CUDA machine (kernels.on_a_gpu:
    auto takes liger when liger-kernel is installed here); the plan's lines name them. A config with `device: cpu`
    gets the plan of its one CPU process, checked against no limit."""
    import os

    from trainer.config import load_config
    from trainer.model.kernels import on_a_gpu
    from trainer.planning.memory_plan import GIB, config_plan, refusal
    from trainer.planning.preflight import with_base_dir

    cfg = with_base_dir(load_config(args.config), args.base_dir)
    world_size = args.gpus or int(os.environ.get("WORLD_SIZE", 1))
    on_gpu = cfg.device != "cpu"  # a CPU run has no GPU memory to fit, nor a CUDA context to allow for
    limit = (int(args.gpu_memory * GIB) if args.gpu_memory else _local_gpu_bytes()) if on_gpu else None
    memory = config_plan(cfg, world_size=world_size, limit=limit, on_gpu=on_gpu,
                         kernels=on_a_gpu(cfg.kernels) if on_gpu else "torch")
    print("\n".join(memory.lines()), flush=True)
    if not memory.fits:
        raise TrainerError(refusal(cfg, memory, on_gpu=on_gpu))
    return 0


def _local_gpu_bytes() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def _check(args) -> int:
    if (args.target is None) != (args.drafter is None) or (args.config is None) == (args.target is None):
        raise TrainerError("check needs --config FILE (a training config), or --target DIR and --drafter CKPT "
                           "(a drafter against the target it will be served with)")
    if args.config is None:
        return _check_parity(args)
    from trainer.planning.preflight import check_config_file

    from_stdin = args.config == "-"
    found = check_config_file(args.config, text=sys.stdin.buffer.read() if from_stdin else None, base_dir=args.base_dir,
                              source=args.source or ("<stdin>" if from_stdin else args.config))
    if args.json:
        print(json.dumps(found.as_dict()), flush=True)
    elif found.ok:
        print(f"ok: {found.source}: a {found.target_layers}-layer target tapped at {found.layer_ids}, "
              f"a dataset of {found.data_files} file(s)", flush=True)
    for problem in found.problems:
        print(f"error: {found.source}: {problem}", file=sys.stderr, flush=True)
    return 0 if found.ok else 2


def _check_parity(args) -> int:
    from trainer.planning.parity import check_parity

    report = check_parity(args.target, args.drafter)
    print(json.dumps(report.as_dict()) if args.json else "\n".join(report.lines()), flush=True)
    return 0 if report.ok else 1


def _export(args) -> int:
    from trainer.export import export

    result = export(args.checkpoint, args.out, target=args.target, dtype=args.dtype, check=not args.no_check,
                    force=args.force)
    print(json.dumps(result.as_dict()) if args.json else "\n".join(result.lines()), flush=True)
    return 0 if result.ok else 1


def _prepare(args) -> int:
    from trainer.data.prepare import prepare

    report = prepare(target=args.target, input_path=args.input, output=args.output, block_size=args.block_size,
                     max_length=args.max_length, overlong=args.overlong, heldout=args.heldout,
                     force=args.force)
    print("\n".join(report.lines(args.output)), flush=True)
    return 0


def _generate(args) -> int:
    from trainer.data.generate import generate
    from trainer.errors import TrainerError

    if (args.target is None) == (args.server is None):
        raise TrainerError("generate needs exactly one of --target (load it here) or --server (ask an engine)")
    request_timeout = None if args.request_timeout is None else _seconds(args.request_timeout, "--request-timeout")
    summary = generate(target=args.target, prompts=args.prompts, output=args.output,
                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, device=args.device,
                       server=args.server, model=args.model, concurrency=args.concurrency, retries=args.retries,
                       retry_wait_s=args.retry_wait, request_timeout_s=request_timeout,
                       progress_every_s=args.progress_every)
    print(summary.as_json() if args.json else summary.line(), flush=True)
    return 1 if summary.failed else 0


def _eval(args) -> int:
    from trainer.decoding.evaluation import evaluate

    report = evaluate(target=args.target, drafter_dir=args.drafter, prompts=args.prompts,
                      max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
                      tree_budgets=args.tree_budget, baseline=args.baseline, batch_size=args.batch_size)
    print(json.dumps(report.as_dict()) if args.json else "\n".join(report.lines()), flush=True)
    return 0 if report.ok else 1


def _seconds(text: str, option: str) -> float:
    """A duration typed on the command line: a finite number of seconds above 0, else a one-line usage error
    (taken as text, not as argparse's float, whose refusal prints the whole usage first)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise TrainerError(f"{option} {text!r}: give a number of seconds above 0, e.g. 120")
    return seconds


def _budgets(text: str) -> list[int]:
    """--tree-budget 8,32,64 (or repeated): node budgets, each at least 1."""
    try:
        budgets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: node budgets are whole numbers, e.g. 8,32,64") from None
    if not budgets or min(budgets) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each node budget must be at least 1")
    return budgets


def _tiny_target(args) -> int:
    from pathlib import Path

    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():  # --force writes over a model, never over a file
        raise TrainerError(f"{out_dir} exists and is not a directory: give a new directory for the model")
    if out_dir.exists() and any(out_dir.iterdir()) and not args.force:
        raise TrainerError(f"{out_dir} is not an empty directory (--force writes over the model in it)")
    from trainer.model.tiny_target import write_tiny_target

    with about_path(out_dir, "create the directory"):
        out_dir.mkdir(parents=True, exist_ok=True)
    path = write_tiny_target(out_dir, family=args.family, composite=args.composite, seed=args.seed)
    kind = args.family + (" composite (image-text)" if args.composite else "")
    print(f"Wrote a tiny random {kind} target to {path}", flush=True)
    return 0


def field_help(model) -> str:
    """Every field of a config model with its default and description, for `train --help`."""
    lines = []
    for name, info in model.model_fields.items():
        default = "required" if info.is_required() else f"default {info.get_default(call_default_factory=True)!r}"
        lines.append(f"  {name} ({default}): {info.description}")
    return "\n".join(lines)


def _add_train_command(commands) -> None:
    from trainer.config import TrainConfig

    train = commands.add_parser(
        "train", help="train a drafter from a YAML config", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a DFlash drafter. Run under torchrun for several GPUs.",
        epilog="config keys (YAML):\n" + field_help(TrainConfig))
    train.add_argument("--config", required=True, help="YAML file with the keys listed below")
    train.add_argument("--resume", default=None, metavar="auto|never|PATH",
                       help="overrides the config's resume: auto (newest complete step_N), never, or a step_N dir")
    train.add_argument("--base-dir", default=None, metavar="DIR",
                       help="take the config's relative paths from DIR (default: the working directory); "
                            "`dflashctl launch` gives the target's workdir, or on `local` the config file's "
                            "directory")
    train.add_argument("--plan", action="store_true",
                       help="print the memory plan of one rank and exit, loading nothing: 0 if it fits, 2 if not")
    train.add_argument("--gpus", type=int, default=None, metavar="N",
                       help="with --plan: the run's number of GPUs (default: WORLD_SIZE, else 1)")
    train.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                       help="with --plan: GiB per GPU (default: this machine's GPU, else not checked)")
    train.set_defaults(run=_train)


def _add_check_command(commands) -> None:
    check = commands.add_parser(
        "check", help="check a config (and its paths and data), or a drafter against its target, loading no model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(textwrap.fill(paragraph, 79) for paragraph in (
            "--config: every problem of a training config in one pass, one line each: the keys and values, the "
            "target, data and output paths, the target's config.json against the taps, the dataset's files and "
            "columns. Exit 0 when `train` would start, 2 otherwise.",
            "--target DIR --drafter CKPT: train/serve parity, one line per check: the mask token is a special "
            "token of the target's tokenizer, the taps lie within the target's layers and agree between config "
            "keys, hidden size, vocabulary, head_dim, RoPE theta and scaling match, block size and sliding-window "
            "layout agree, the target has a chat template. Exit 0 when all hold, 1 on a mismatch (each line says "
            "what to change), 2 when a directory is not a model.",
            "Needs no torch.")))
    check.add_argument("--config", default=None, help="YAML config file, or - for stdin")
    check.add_argument("--target", default=None, metavar="DIR", help="target model directory (with --drafter)")
    check.add_argument("--drafter", default=None, metavar="CKPT",
                       help="drafter checkpoint directory (a step_N or an export; with --target)")
    check.add_argument("--base-dir", default=None, metavar="DIR",
                       help="take relative paths from DIR, as `train --base-dir DIR` does (default: here); "
                            "DIR need not exist yet")
    check.add_argument("--source", default=None, metavar="NAME", help="the config's name in messages")
    check.add_argument("--json", action="store_true",
                       help="print one JSON object: ok, and the problems (--config) or the checks (--drafter)")
    check.set_defaults(run=_check)


def _add_export_command(commands) -> None:
    export = commands.add_parser(
        "export", help="write a serving-only copy of a checkpoint (no training state)",
        description="Copy a drafter checkpoint for serving: config.json (with auto_map and "
                    "eagle_aux_hidden_state_layer_ids), model.safetensors in --dtype, the modeling file dflash.py "
                    "(AutoModel.from_pretrained(OUT, trust_remote_code=True) loads it) and a README.md card, "
                    "without optimizer state or master weights. Runs the train/serve parity check against the "
                    "target first (the training config's target_path, or --target) and writes nothing if it fails.")
    export.add_argument("checkpoint", metavar="CKPT", help="drafter checkpoint directory (a step_N)")
    export.add_argument("out", metavar="OUT", help="directory to write (new, or empty)")
    export.add_argument("--target", default=None, metavar="DIR",
                        help="target model directory for the parity check (default: the checkpoint's target_path)")
    export.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="weights dtype (default bfloat16, as the public DFlash drafters)")
    export.add_argument("--no-check", action="store_true", help="skip the parity check (no target at hand)")
    export.add_argument("--force", action="store_true", help="write into OUT even if it is not empty")
    export.add_argument("--json", action="store_true", help="print one JSON object")
    export.set_defaults(run=_export)


def _add_prepare_command(commands) -> None:
    prepare = commands.add_parser(
        "prepare", help="tokenize JSONL chat records into an Arrow dataset",
        description="Tokenize chat records (JSONL) with the target's tokenizer and chat template into a "
                    "memory-mapped Arrow dataset for `train`, the loss on the assistant's tokens only. A share of "
                    "the chats is held out in OUTPUT/heldout for eval_every. OUTPUT must be new or empty.")
    prepare.add_argument("--target", required=True, help="target model directory (its tokenizer and chat template)")
    prepare.add_argument("--input", required=True, help='JSONL: {"messages": [...]} or {"prompt", "completion"}')
    prepare.add_argument("--output", required=True, help="dataset directory to write (new, or empty)")
    prepare.add_argument("--block-size", type=int, default=16,
                         help="drop samples with fewer than 2*block-size supervised tokens (default 16)")
    prepare.add_argument("--max-length", type=int, default=None, help="longest sample in tokens (default: none)")
    prepare.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                         help="what to do with samples over --max-length (default truncate)")
    prepare.add_argument("--heldout", type=float, default=0.01, metavar="SHARE",
                         help="share of the samples set aside in OUTPUT/heldout, never trained on, for the "
                              "trainer's eval_every (by a hash of each chat: the same split every time; "
                              "default 0.01, 0 = none)")
    prepare.add_argument("--force", action="store_true",
                         help="replace the dataset an earlier prepare wrote to --output (never anything else)")
    prepare.set_defaults(run=_prepare)


def _add_generate_command(commands) -> None:
    generate = commands.add_parser(
        "generate", help="regenerate answers with the target itself (greedy), resumably",
        description="Answer each prompt with the target (greedy) and append one chat record per answer, with "
                    "its prompt's index, to --output. A rerun skips the prompts already answered. Prompts that "
                    "fail for good go to OUTPUT.failed.jsonl; the exit code is then 1.")
    generate.add_argument("--target", help="target model directory, loaded here (small jobs)")
    generate.add_argument("--server", help="URL of an OpenAI-compatible server (vLLM, SGLang) serving the target")
    generate.add_argument("--model", help="the served model's name (default: the server's only one)")
    generate.add_argument("--concurrency", type=int, default=8, help="requests in flight with --server (default 8)")
    generate.add_argument("--retries", type=int, default=6,
                          help="retries of a request on 429, 5xx, a lost connection or a timeout (default 6)")
    generate.add_argument("--retry-wait", type=float, default=1.0,
                          help="seconds before the first retry, doubling each time (default 1)")
    generate.add_argument("--request-timeout", metavar="S",
                          help="with --server: the longest one request may take, whole (connecting, waiting, "
                               "reading the answer): one the server has not answered in full within S seconds (a "
                               "hung server, or one that drips its answer) is given up and asked again like a "
                               "failed one (default 120, or 0.1 s per --max-new-tokens token if that is longer: "
                               "the answer comes whole at its end)")
    generate.add_argument("--prompts", required=True, help='JSONL: {"messages": [...]} or {"prompt": ...}')
    generate.add_argument("--output", required=True, help="JSONL of chat records to append to (resumed)")
    generate.add_argument("--max-new-tokens", type=int, default=512, help="answer length limit (default 512)")
    generate.add_argument("--batch-size", type=int, default=16,
                          help="prompts per generate call without --server (default 16)")
    generate.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    generate.add_argument("--progress-every", type=float, default=10.0,
                          help="seconds between progress lines on stderr (default 10)")
    generate.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    generate.set_defaults(run=_generate)


def _add_eval_command(commands) -> None:
    evaluate = commands.add_parser(
        "eval", help="speculative decoding: acceptance length and speed vs greedy, beside an untrained baseline",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Decode the prompts greedily, then speculatively with the drafter (chain), with an untrained\n"
                    "drafter of the same shape (baseline) and with the drafter's DDTree trees (--tree-budget), and\n"
                    "check that every output equals greedy's. Reports tau (tokens kept per target forward),\n"
                    "per-position acceptance (share of rounds keeping at least k drafted tokens) and tok/s.",
        epilog="Targets decode --batch-size prompts at once over one cache; hybrid (linear-attention) targets\n"
               "chains only, sliding-window targets one prompt at a time, chains only.\n"
               "Exit 0: every output equals greedy (in bfloat16/float16 up to near-ties within rounding, listed\n"
               "as precision notes); 1: a real divergence; 2: bad input.")
    evaluate.add_argument("--target", required=True, help="target model directory")
    evaluate.add_argument("--drafter", required=True, help="drafter checkpoint directory (a step_N)")
    evaluate.add_argument("--prompts", required=True, help='JSONL: {"messages": [...]} or {"prompt": ...}')
    evaluate.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    evaluate.add_argument("--tree-budget", type=_budgets, action="extend", default=[], metavar="N[,N...]",
                          help="also decode with DDTree trees of N drafted nodes (best-first on the product of "
                               "the drafter's slot probabilities, verified in one forward); repeatable, e.g. "
                               "8,32,64. Full-attention targets only")
    evaluate.add_argument("--no-baseline", dest="baseline", action="store_false",
                          help="skip the untrained baseline drafter")
    evaluate.add_argument("--batch-size", type=int, default=64,
                          help="prompts decoded at once on full-attention targets (default 64)")
    evaluate.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    evaluate.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto",
                          help="target weights: auto = bfloat16 on GPU, float32 on CPU. float32 checks the "
                               "outputs exactly; in lower precision a divergence at a near-tie of the target's "
                               "two best logits (margin within 8 epsilons of the largest) is a precision note")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(run=_eval)


def _add_tiny_target_command(commands) -> None:
    tiny = commands.add_parser("tiny-target", help="write a tiny random target (no downloads)",
                               description="A tiny random target and its tokenizer, for CPU tests and demos.")
    tiny.add_argument("out_dir", metavar="OUT_DIR", help="directory to write (new, or empty)")
    tiny.add_argument("--family", choices=("qwen3", "qwen3.5", "qwen3.5-moe"), default="qwen3",
                      help="qwen3 (dense), or a Qwen3.5 hybrid: 3 Gated DeltaNet layers per full-attention one "
                           "(default qwen3)")
    tiny.add_argument("--composite", action="store_true",
                      help="write a Qwen3.5 image-text checkpoint (vision tower + language model), as the "
                           "published Qwen3.5/3.6 models are")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    tiny.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    tiny.set_defaults(run=_tiny_target)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="DFlash drafter trainer.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_command(commands)
    _add_check_command(commands)
    _add_export_command(commands)
    _add_prepare_command(commands)
    _add_generate_command(commands)
    _add_eval_command(commands)
    _add_tiny_target_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from trainer.training.startup import dump_stacks_on_signal, quiet_progress_bars

    quiet_progress_bars()  # before any command loads datasets or transformers
    dump_stacks_on_signal()
    try:
        return args.run(args)
    except TrainerError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr, flush=True)
        return getattr(exc, "exit_code", 2)
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - the one place that turns any crash into a traceback and exit 1
        traceback.print_exc()
        sys.stderr.flush()
        return 1


if __name__ == "__main__":
    sys.exit(main())
