"""Prompts/s and tokens/s of `python -m trainer generate` on both paths: the target loaded in the process
(Hugging Face `generate` in batches) and `--server` against an OpenAI-compatible server of the same target
(trainer/data/chat_server.py here; vLLM or SGLang on a GPU box, given with --server-url).

    python bench/bench_generate.py --prompts 32 --max-new-tokens 32            # tiny random target, CPU
    python bench/bench_generate.py --target DIR --server-url http://127.0.0.1:8000 --prompts 2000

Each path runs as a real process, as a user would; the figures are the summary's (`--json`): answer tokens
and prompts per second of the generation itself, the model load excluded.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from trainer_env import REPO_ROOT, trainer_env  # bench/ is on sys.path when one of its scripts runs


def write_prompts(path: Path, count: int) -> Path:
    import random

    from trainer.model.tiny_target import tokenizer_corpus

    rng, words = random.Random(0), " ".join(tokenizer_corpus()).split()
    path.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(rng.randint(6, 16)))})
                            + "\n" for _ in range(count)))
    return path


def run_generate(*args: str) -> dict:
    env = trainer_env()
    done = subprocess.run([sys.executable, "-m", "trainer", "generate", *args, "--json"], capture_output=True,
                          text=True, env=env, cwd=REPO_ROOT, check=False)
    if done.returncode != 0:
        sys.exit(f"generate failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def report(name: str, summary: dict) -> None:
    seconds = max(summary["seconds"], 1e-9)
    print(f"{name:<28} {summary['answered']:6d} prompts {summary['tokens']:8d} tokens {seconds:8.2f}s  "
          f"{summary['answered'] / seconds:8.2f} prompts/s {summary['tokens'] / seconds:10.1f} tok/s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="target directory (default: a tiny random Qwen3 made here)")
    parser.add_argument("--prompts", type=int, default=32, help="how many prompts (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="answer length limit (default 32)")
    parser.add_argument("--batch-size", type=int, default=16, help="the local path's batch (default 16)")
    parser.add_argument("--concurrency", type=int, default=4, help="--server requests in flight (default 4)")
    parser.add_argument("--server-url", help="an engine already serving the target (default: chat_server.py here)")
    parser.add_argument("--device", default="auto", help="the local path's device (default auto)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        target = Path(args.target) if args.target else None
        if target is None:
            from trainer.model.tiny_target import write_tiny_target

            target = write_tiny_target(root / "tiny", seed=0)
        prompts = write_prompts(root / "prompts.jsonl", args.prompts)
        common = ["--prompts", str(prompts), "--max-new-tokens", str(args.max_new_tokens)]
        report(f"local (batch {args.batch_size})", run_generate(
            "--target", str(target), "--output", str(root / "local.jsonl"), "--batch-size", str(args.batch_size),
            "--device", args.device, *common))
        server, url = None, args.server_url
        if url is None:
            from trainer.data.chat_server import ChatServer

            server = ChatServer(target)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            url = server.url
        try:
            report(f"--server (concurrency {args.concurrency})", run_generate(
                "--server", url, "--output", str(root / "served.jsonl"), "--concurrency", str(args.concurrency),
                *common))
        finally:
            if server is not None:
                server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
