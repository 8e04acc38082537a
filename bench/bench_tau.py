"""Does the trainer's τ predict serving? A small target with real structure, built here, end to end.

1. A Qwen3-shaped LM (15.7M parameters) is trained from scratch on the Python source of this machine's
   standard library, as chats (user: the first lines of a snippet; assistant: the lines after), with a BPE
   tokenizer trained on the same text.
2. It answers prompts from other snippets greedily (`trainer generate`); `trainer prepare` tokenizes the answers
   and sets a held-out share aside; `trainer train` trains a DFlash drafter on them (a real run, eval_every on).
3. `trainer eval` (real speculative decoding against the target) runs on held-out prompts.

The figures, printed as one JSON object on stdout (progress on stderr): held-out τ replayed by the trainer
(`tau_heldout`), τ measured by `trainer eval` on held-out prompts, and the old prediction streak + 1; and per
DDTree node budget (the trainer's default eval_tree_budgets) the replayed `tau_tree_heldout` against
`trainer eval --tree-budget` on the same held-out prompts.

    python bench/bench_tau.py --device cuda        # one H200: about 6 minutes
    python bench/bench_tau.py --tiny               # a CPU smoke run of every stage (about a minute)
    python bench/bench_tau.py --device cuda --target-precision fp8   # also a drafter on FP8 target features, and
                                                                     # their relative error on held-out samples
"""
from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from trainer_env import REPO_ROOT, trainer_env  # bench/ is on sys.path when one of its scripts runs
sys.path.insert(0, str(REPO_ROOT))

SIZES = {  # name: (vocab, hidden, layers, heads, kv heads, head_dim, MLP)
    "gpu": (4096, 384, 8, 6, 2, 64, 1024),
    "tiny": (512, 64, 2, 4, 2, 16, 128),
}


def say(message: str) -> None:
    print(f"[bench_tau] {message}", file=sys.stderr, flush=True)


def code_snippets(*, max_bytes: int, lines_per_snippet: int) -> list[str]:
    """Snippets of the standard library's Python files (not site-packages), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    snippets, taken = [], 0
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for start in range(0, len(lines) - lines_per_snippet, lines_per_snippet):
            text = "\n".join(lines[start:start + lines_per_snippet])
            if text.strip():
                snippets.append(text)
                taken += len(text)
        if taken >= max_bytes:
            break
    return snippets


def as_chat(snippet: str, prompt_lines: int) -> list[dict[str, str]]:
    lines = snippet.split("\n")
    return [{"role": "user", "content": "\n".join(lines[:prompt_lines])},
            {"role": "assistant", "content": "\n".join(lines[prompt_lines:])}]


def train_target(out_dir: Path, snippets: list[str], args, device) -> dict:
    """The LM: a tokenizer and a Qwen3 trained on the snippets as chats; saved to `out_dir` as a HF directory."""
    import torch
    from transformers import Qwen3ForCausalLM

    from trainer.model.tiny_target import build_tokenizer, tiny_qwen3_config

    vocab, hidden, layers, heads, kv_heads, head_dim, mlp = SIZES[args.size]
    tokenizer = build_tokenizer(vocab, corpus=snippets[:20000])
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_qwen3_config(
        tokenizer, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=mlp, max_position_embeddings=4096, initializer_range=0.02)).to(device)
    texts = [tokenizer.apply_chat_template(as_chat(s, args.prompt_lines), tokenize=False) for s in snippets]
    stream = [token for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] for token in ids]
    tokens = torch.tensor(stream, dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lm_lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = torch.Generator().manual_seed(0)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    began, step, loss = time.perf_counter(), 0, math.nan
    while step < args.lm_steps and time.perf_counter() - began < args.lm_seconds:
        starts = torch.randint(0, len(tokens) - args.lm_seq_len - 1, (args.lm_batch,), generator=rng)
        batch = torch.stack([tokens[s:s + args.lm_seq_len] for s in starts.tolist()]).to(device)
        for group in optimizer.param_groups:  # warmup, then cosine to a tenth
            progress = min(1.0, step / max(1, args.lm_steps))
            group["lr"] = args.lm_lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        with autocast:
            out = model(input_ids=batch, labels=batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 200 == 0 or step == 1:
            loss = out.loss.item()
            say(f"target LM step {step}: loss {loss:.3f}")
    loss = out.loss.item()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.to(torch.float32).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "steps": step, "loss": round(loss, 4),
            "corpus_tokens": len(stream), "seconds": round(time.perf_counter() - began, 1)}


def trainer_process(*args: str, log: Path) -> None:
    env = trainer_env()
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "trainer", *args], stdout=sink, stderr=subprocess.STDOUT,
                              env=env, cwd=REPO_ROOT, check=False)
    if done.returncode != 0:
        tail = log.read_text().splitlines()[-30:]
        raise SystemExit(f"trainer {args[0]} failed ({done.returncode}):\n" + "\n".join(tail))


def drafter_config(work: Path, args, name: str = "drafter", precision: str = "bf16") -> dict:
    return {
        "target_path": str(work / "target"), "data_path": str(work / "dataset"), "output_dir": str(work / name),
        "target_precision": precision,
        "max_steps": args.drafter_steps, "block_size": args.block_size, "drafter_layers": args.drafter_layers,
        "token_budget": args.token_budget, "buckets": [0, 256, 512, 1024], "lr": args.drafter_lr,
        "log_every": max(1, args.drafter_steps // 20), "checkpoint_every": 0, "seed": 0, "device": args.device,
        "eval_every": max(1, args.drafter_steps // 5), "eval_samples": args.eval_samples, "eval_prompts": 0,
        "replay_sequences": 4, "num_workers": 2, "prefetch": 4,
    }


def heldout_prompts(chats: Path, out: Path, *, share: float, count: int) -> int:
    """The prompts of the chats `prepare` held out (the same hash decides), at most `count`."""
    from trainer.data.prepare import is_heldout, record_messages

    written = 0
    with out.open("w") as sink:
        for number, line in enumerate(chats.read_text().splitlines(), 1):
            messages = record_messages(json.loads(line), where=f"{chats}:{number}")
            if written < count and is_heldout(messages, share):
                sink.write(json.dumps({"messages": messages[:-1]}) + "\n")
                written += 1
    return written


def step_records(metrics: Path) -> list[dict]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r for r in records if r.get("event") == "step"]


def training_figures(work: Path, name: str = "drafter") -> dict:
    """The drafter run's own figures at its end (its output directory `name` in `work`): streak (and the old
    streak + 1), the replayed τ on its training batches and on the held-out split."""
    records = step_records(work / name / "metrics.jsonl")
    last = records[-1]
    tail = records[-5:]  # a few logged steps: one batch's streak and replay are noisy
    heldout = [r for r in records if "tau_heldout" in r]
    return {"steps": last["step"], "loss": round(last["loss"], 4), "streak": round(last["streak"], 3),
            "streak_plus_1": round(last["streak"] + 1, 3),
            "streak_plus_1_last_logs": round(sum(r["streak"] for r in tail) / len(tail) + 1, 3),
            "tau_replay_train_last_logs": round(sum(r["tau_replay"] for r in tail) / len(tail), 3),
            "tau_heldout": heldout[-1]["tau_heldout"] if heldout else None,
            "tau_tree_heldout": heldout[-1].get("tau_tree_heldout") if heldout else None,
            "accept_hist_heldout": heldout[-1].get("accept_hist_heldout") if heldout else None,
            "tau_heldout_by_step": {r["step"]: round(r["tau_heldout"], 3) for r in heldout}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run at a tiny size (every stage runs)")
    parser.add_argument("--workdir", default=None, help="keep everything here (default: a temporary directory)")
    parser.add_argument("--corpus-mb", type=float, default=12.0, help="standard-library source to read, MB")
    parser.add_argument("--lm-steps", type=int, default=4000)
    parser.add_argument("--lm-seconds", type=float, default=150.0, help="time budget of the LM's training")
    parser.add_argument("--prompts", type=int, default=3000, help="prompts the target answers for the drafter")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--heldout", type=float, default=0.03, help="prepare's held-out share")
    parser.add_argument("--drafter-steps", type=int, default=700)
    parser.add_argument("--eval-prompts", type=int, default=48, help="held-out prompts `trainer eval` decodes")
    parser.add_argument("--eval-dtype", default="float32", help="trainer eval's dtype (float32: exact greedy)")
    parser.add_argument("--target-precision", choices=("bf16", "fp8"), default="bf16",
                        help="fp8: also train a drafter on FP8 target features (target_precision: fp8, a GPU with "
                             "FP8), the same steps and seed, and decode it as the first (against the unquantized "
                             "target, as it would be served): its held-out chain τ against the bf16 one's")
    args = parser.parse_args(argv)
    args.size = "tiny" if args.tiny else "gpu"
    args.prompt_lines, args.lm_lr, args.drafter_lr, args.block_size, args.drafter_layers = 4, 2e-3, 6e-4, 16, 3
    args.lm_seq_len, args.lm_batch, args.token_budget, args.eval_samples = 256, 64, 16384, 64
    if args.tiny:  # every stage at a size that a 2-core CPU runs in about a minute
        args.device = "cpu"
        args.corpus_mb, args.lm_steps, args.lm_seq_len, args.lm_batch, args.prompts = 0.2, 20, 64, 8, 32
        args.max_new_tokens, args.heldout, args.drafter_steps, args.eval_prompts = 24, 0.25, 6, 3
        args.block_size, args.drafter_layers, args.token_budget, args.eval_samples = 8, 1, 2048, 4
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.target_precision == "fp8" and args.device != "cuda":
        parser.error("--target-precision fp8 needs a GPU with FP8 (--device cuda)")
    return args


def prepare_data(work: Path, snippets: list[str], args) -> dict:
    from trainer.data.generate import generate
    from trainer.data.prepare import prepare

    rng = random.Random(1)
    picked = rng.sample(snippets, min(args.prompts, len(snippets)))
    with (work / "prompts.jsonl").open("w") as sink:
        for snippet in picked:
            sink.write(json.dumps({"messages": as_chat(snippet, args.prompt_lines)[:1]}) + "\n")
    began = time.perf_counter()
    generate(target=work / "target", prompts=work / "prompts.jsonl", output=work / "chats.jsonl",
             max_new_tokens=args.max_new_tokens, batch_size=256 if args.device == "cuda" else 16,
             device=args.device, say=say)
    generated = time.perf_counter() - began
    report = prepare(target=work / "target", input_path=work / "chats.jsonl", output=work / "dataset",
                     block_size=args.block_size, heldout=args.heldout)
    return {"prompts": len(picked), "train_samples": report.kept, "heldout_samples": report.set_aside,
            "train_tokens": report.tokens, "generate_seconds": round(generated, 1)}


def run(work: Path, args) -> dict:
    import torch

    began = time.perf_counter()
    snippets = code_snippets(max_bytes=int(args.corpus_mb * 1e6), lines_per_snippet=16)
    random.Random(0).shuffle(snippets)
    cut = int(len(snippets) * 0.8)  # the LM never sees the snippets the prompts come from
    say(f"{len(snippets)} snippets of standard-library source; training the target on {cut}")
    target = train_target(work / "target", snippets[:cut], args, torch.device(args.device))
    say(f"target: {target}")
    data = prepare_data(work, snippets[cut:], args)
    say(f"data: {data}")
    training, report, count, eval_seconds = train_and_decode(work, args)
    eval_tau = report.tau
    heldout_tau = training["tau_heldout"]
    replayed_trees = training["tau_tree_heldout"] or {}
    trees = {tree.budget: {"eval_heldout_prompts": round(tree.tau, 4),
                           "replay_heldout": (None if str(tree.budget) not in replayed_trees
                                              else round(replayed_trees[str(tree.budget)], 4)),
                           "replay_over_eval": round(replayed_trees[str(tree.budget)] / tree.tau, 4)
                           if str(tree.budget) in replayed_trees and tree.tau else None}
             for tree in report.trees}
    precision = None
    if args.target_precision == "fp8":
        fp8_training, fp8_report, _, _ = train_and_decode(work, args, name="drafter-fp8", precision="fp8")
        precision = {"bf16": {"eval_tau": round(eval_tau, 4), "tau_heldout": heldout_tau},
                     "fp8": {"eval_tau": round(fp8_report.tau, 4), "tau_heldout": fp8_training["tau_heldout"],
                             "identical_to_greedy": fp8_report.identical_to_greedy, "steps": fp8_training["steps"],
                             "seconds": fp8_training["seconds"]},
                     "eval_tau_fp8_over_bf16": round(fp8_report.tau / eval_tau, 4) if eval_tau else None,
                     "features": fp8_feature_error(work / "target", *heldout_batch(work / "dataset", 32),
                                                   num_taps=args.drafter_layers, device=args.device)}
        say(f"FP8 target features against bf16 on held-out samples: {precision['features']}")
    return {
        "device": args.device, "size": args.size, "target": target, "data": data, "drafter": training,
        "eval": {"prompts": count, "tau": round(eval_tau, 4), "rounds": report.rounds,
                 "identical_to_greedy": report.identical_to_greedy, "dtype": args.eval_dtype,
                 "speculative_tok_per_s": round(report.speculative_tok_per_s, 1),
                 "greedy_tok_per_s": round(report.greedy_tok_per_s, 1),
                 "seconds": eval_seconds},
        "tau": {"eval_heldout_prompts": round(eval_tau, 4),
                "replay_heldout": None if heldout_tau is None else round(heldout_tau, 4),
                "replay_train_batches": training["tau_replay_train_last_logs"],
                "streak_plus_1": training["streak_plus_1_last_logs"],
                "replay_over_eval": None if heldout_tau is None or not eval_tau else round(heldout_tau / eval_tau, 4),
                "streak_plus_1_over_eval": round(training["streak_plus_1_last_logs"] / eval_tau, 4) if eval_tau else None},
        "tree_tau": trees,
        **({"target_precision": precision} if precision else {}),
        "seconds": round(time.perf_counter() - began, 1),
    }


def heldout_batch(dataset: Path, count: int):
    """The first `count` samples of a prepared dataset's held-out split as one right-padded batch (input_ids,
    attention mask), as the trainer collates them."""
    import numpy as np

    from trainer.data.batches import collate, open_dataset

    heldout = open_dataset(dataset / "heldout")
    rows = np.arange(min(count, len(heldout)))
    (input_ids, _, attention_mask), _ = collate(heldout, rows, max_length=int(heldout.lengths[rows].max()),
                                                pad_to=None, pad_token_id=0, pin_memory=False)
    return input_ids, attention_mask


def fp8_feature_error(target_dir: Path, input_ids, attention_mask, *, num_taps: int, device: str) -> dict:
    """The tapped features (the trainer's default taps for `num_taps`) of the target with FP8 linear layers against
    its bf16 self on a right-padded batch, at its real positions: the relative error of all taps together and of
    each. Off a GPU the FP8 products are emulated in fp32 (tests)."""
    import torch
    from target_precision import tap_errors

    from trainer.model.target import TargetModel

    on_gpu = device == "cuda"
    target = TargetModel.load(target_dir, layer_ids=None, num_taps=num_taps, device=device,
                              dtype=torch.bfloat16 if on_gpu else torch.float32)
    real = attention_mask.bool().to(target.device)
    reference = target.features(input_ids, attention_mask)[real].float()
    target.to_fp8(emulate=not on_gpu)
    together, per_tap = tap_errors(target.features(input_ids, attention_mask)[real].float(), reference,
                                   target.hidden_size)
    return {"taps": target.layer_ids, "tokens": int(real.sum()), "relative_error": round(together, 4),
            "per_tap_relative_error": [round(e, 4) for e in per_tap]}


def train_and_decode(work: Path, args, name: str = "drafter", precision: str = "bf16"):
    """One drafter run (`trainer train`, output `work/name`) and `trainer eval` of its last checkpoint on the
    held-out prompts: (training figures, eval report, prompts decoded, eval seconds)."""
    import yaml

    from trainer.config import DEFAULT_TREE_BUDGETS
    from trainer.decoding.evaluation import evaluate

    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(drafter_config(work, args, name, precision), sort_keys=False))
    trained = time.perf_counter()
    trainer_process("train", "--config", str(config), log=work / f"train-{name}.log")
    training = training_figures(work, name) | {"seconds": round(time.perf_counter() - trained, 1)}
    say(f"{name} (target {precision}): {training}")
    count = heldout_prompts(work / "chats.jsonl", work / "heldout_prompts.jsonl", share=args.heldout,
                            count=args.eval_prompts)
    evaluated = time.perf_counter()
    report = evaluate(target=work / "target", drafter_dir=work / name / f"step_{training['steps']}",
                      prompts=work / "heldout_prompts.jsonl", max_new_tokens=args.max_new_tokens,
                      device=args.device, dtype=args.eval_dtype, baseline=False, tree_budgets=DEFAULT_TREE_BUDGETS)
    return training, report, count, round(time.perf_counter() - evaluated, 1)


def in_workdir(workdir: str | None, prefix: str, body):
    """body(work) in `workdir` (made if missing, kept afterwards) or in a temporary directory removed afterwards."""
    import tempfile

    if workdir:
        work = Path(workdir)
        work.mkdir(parents=True, exist_ok=True)
        return body(work)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return body(Path(tmp))


def main(argv=None) -> int:
    args = parse_args(argv)
    result = in_workdir(args.workdir, "bench_tau-", lambda work: run(work, args))
    print(json.dumps(result, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
