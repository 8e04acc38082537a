"""Wall time and tok/s of `python -m trainer eval`, against the way it decoded before (one prompt at a time).

    python bench/bench_eval.py                                   # tiny random target, CPU: 40 prompts x 48 tokens
    python bench/bench_eval.py --prompts 40 --max-new-tokens 48 --tree-budget 8,32,64
    python bench/bench_eval.py --model qwen3-8b --train-steps 50 --max-new-tokens 128 --tree-budget 8,32,64

The new figure is `trainer eval` as a user runs it, a real process timed from start to exit (target load
included): greedy and the drafter's chain, plus the untrained baseline (and trees) it now reports. The old figure
is the previous eval's loop, timed in this process with the model already loaded: for each prompt, greedy one
token at a time, then the chain with the cache cropped after each verify (the functions of
trainer/decoding/speculative.py it used). The machine's load average is printed first: measure when it is quiet.

`--model qwen3-8b` (a GPU) writes a random bf16 target of that shape, trains a drafter on random tokens for
`--train-steps` steps as a real `trainer train`, and evaluates it (bf16: near-ties are precision notes).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainer_env import REPO_ROOT, trainer_env  # bench/ is on sys.path when one of its scripts runs


def say(message: str) -> None:
    print(f"[bench_eval] {message}", file=sys.stderr, flush=True)


def write_prompts(path: Path, count: int) -> Path:
    import random

    from trainer.model.tiny_target import tokenizer_corpus

    rng, words = random.Random(3), " ".join(tokenizer_corpus()).split()
    path.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(rng.randint(6, 16)))})
                            + "\n" for _ in range(count)))
    return path


def untrained_drafter(target: Path, out: Path, *, layers: int, block_size: int) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.drafter_files import save_drafter
    from trainer.planning.taps import default_target_layer_ids

    import torch

    config = AutoConfig.from_pretrained(str(target))
    drafter_config = DrafterConfig.from_target(
        config, num_layers=layers, block_size=block_size,
        mask_token_id=AutoTokenizer.from_pretrained(str(target)).mask_token_id,
        target_layer_ids=default_target_layer_ids(config.num_hidden_layers, layers))
    shared = torch.nn.Embedding(config.vocab_size, config.hidden_size)
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    torch.manual_seed(0)
    save_drafter(DFlashDrafter(drafter_config, embed_tokens=shared, lm_head=head), out)
    return out


def trained_drafter(target: Path, root: Path, *, steps: int, device: str, layers: int, block_size: int) -> Path:
    """A drafter trained on random tokens as a real `trainer train` (a GPU run's config, checkpoint at the end)."""
    import yaml

    from synthetic import write_random_dataset

    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    data = write_random_dataset(root / "data", samples=3000, min_len=256, max_len=3072, vocab=vocab)
    config = {"target_path": str(target), "data_path": str(data), "output_dir": str(root / "out"),
              "max_steps": steps, "buckets": [0, 1024, 2048, 3073], "max_length": 3072, "token_budget": 8192,
              "log_every": 10, "checkpoint_every": 0, "device": device, "num_workers": 4,
              "drafter_layers": layers, "block_size": block_size}
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    say(f"training a drafter for {steps} steps (its output follows on stderr)")
    done = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(root / "run.yaml")],
                          env=trainer_env(), cwd=REPO_ROOT, stdout=sys.stderr, check=False)
    if done.returncode != 0:
        sys.exit(f"train failed ({done.returncode}): its output is above")
    return root / "out" / f"step_{steps}"


def run_eval(target: Path, drafter: Path, prompts: Path, args) -> tuple[dict, float]:
    command = [sys.executable, "-m", "trainer", "eval", "--target", str(target), "--drafter", str(drafter),
               "--prompts", str(prompts), "--max-new-tokens", str(args.max_new_tokens), "--device", args.device,
               "--json", *(["--tree-budget", args.tree_budget] if args.tree_budget else [])]
    say("trainer eval (its progress follows on stderr)")
    started = time.perf_counter()
    done = subprocess.run(command, env=trainer_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"eval failed ({done.returncode}): its output is above")
    return json.loads(done.stdout), seconds


def old_loop(target: Path, drafter_dir: Path, prompts: Path, args) -> tuple[float, float, float]:
    """(seconds, greedy tok/s, chain tok/s) of the previous eval's loop, one prompt at a time."""
    from trainer.data.generate import load_target_for_generation, pick_device, read_prompts
    from trainer.decoding.evaluation import _tokenize
    from trainer.decoding.speculative import LayerTaps, greedy_decode, speculative_decode
    from trainer.model.drafter_files import load_drafter

    device = pick_device(args.device)
    model, tokenizer = load_target_for_generation(target, device)
    from trainer.model.cpu_threads import one_thread_for_a_small_model

    # the threads eval uses: the comparison is the batching
    one_thread_for_a_small_model(model.config.hidden_size, device, lambda line: None, command="eval")
    drafter = load_drafter(drafter_dir, embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings(), device=device).eval()
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    greedy = spec = tokens = 0.0
    for ids in _tokenize(tokenizer, read_prompts(prompts)):
        done = greedy_decode(model, ids, max_new_tokens=args.max_new_tokens, eos_ids=set())
        greedy += done.seconds
        tokens += len(done.tokens)
        spec += speculative_decode(model, drafter, taps, ids, max_new_tokens=args.max_new_tokens,
                                   eos_ids=set()).seconds
    taps.remove()
    return greedy + spec, tokens / greedy, tokens / spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (default, CPU) or a synthetic shape, e.g. qwen3-8b")
    parser.add_argument("--prompts", type=int, default=40, help="how many prompts (default 40)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per prompt (default 48)")
    parser.add_argument("--tree-budget", default="", help="e.g. 8,32,64 (default: chains only)")
    parser.add_argument("--drafter", help="a drafter checkpoint (default: untrained, or trained with --train-steps)")
    parser.add_argument("--train-steps", type=int, default=0, help="train a drafter this long first (GPU shapes)")
    parser.add_argument("--no-old", action="store_true", help="skip the one-prompt-at-a-time loop")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cpus: {os.cpu_count()}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if args.model == "tiny":
            from trainer.model.tiny_target import write_tiny_target

            target = write_tiny_target(root / "tiny", seed=0)
        else:
            from synthetic import write_random_target

            say(f"writing a random {args.model} target")
            target = write_random_target(root / args.model, args.model)
        shape = dict(layers=2, block_size=8) if args.model == "tiny" else dict(layers=5, block_size=16)
        drafter = Path(args.drafter) if args.drafter else (
            trained_drafter(target, root, steps=args.train_steps, device=args.device if args.device != "auto"
                            else "cuda", **shape) if args.train_steps else
            untrained_drafter(target, root / "drafter", **shape))
        prompts = write_prompts(root / "prompts.jsonl", args.prompts)
        report, seconds = run_eval(target, drafter, prompts, args)
        print(f"new: trainer eval (greedy, chain, baseline{', trees' if args.tree_budget else ''}): {seconds:.1f}s "
              f"wall for {args.prompts} prompts x {args.max_new_tokens} tokens, target load included", flush=True)
        print(f"  greedy {report['greedy_tok_per_s']:.1f} tok/s; chain tau {report['tau']:.3f} "
              f"{report['speculative_tok_per_s']:.1f} tok/s; baseline tau {report['baseline']['tau']:.3f} "
              f"{report['baseline']['tok_per_s']:.1f} tok/s", flush=True)
        for tree in report["trees"]:
            print(f"  tree {tree['budget']}: tau {tree['tau']:.3f} {tree['tok_per_s']:.1f} tok/s", flush=True)
        print(f"  failures {len(report['failures'])}, precision notes {len(report['precision_notes'])}", flush=True)
        if not args.no_old:
            old, greedy, chain = old_loop(target, drafter, prompts, args)
            print(f"old: one prompt at a time (greedy, chain): {old:.1f}s decoding alone, greedy {greedy:.1f} tok/s, "
                  f"chain {chain:.1f} tok/s", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
