"""Parser throughput: a realistic synthetic trainer log fed to LogParser in 64 KiB chunks, as the watch agent
delivers it. Prints lines/s (goal: at least 200K lines/s on one core).

    python bench/bench_parser.py [--steps 1000000] [--chunk 65536] [--repeat 3]
"""
from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from orchestrator.trainlog.parser import LogParser
from dflash_records.step import StepRecord, format_step_line
from trainer.logformat import (
    format_batches_line,
    format_bucket_table,
    format_dataset_lines,
    format_loading_targets,
    format_target_on,
)

TRACEBACK = """Exception in thread drafter-2:
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner
    self.run()
  File "/workspace/trainer/train.py", line 212, in drafter_worker
    loss = step(batch)
           ^^^^^^^^^^^
RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function
"""
NOISE = (
    "W1201 00:12:03.123000 1234 torch/_dynamo/convert_frame.py:844] torch._dynamo hit config.cache_size_limit",
    "\x1b[33mwarning:\x1b[0m gradient norm 12.3 clipped to 1.0",
    "Saving checkpoint to /workspace/out/step_1000 ...",
    " 45%|\u2588\u2588\u2588\u2588\u258c     | 45/100 [00:12<00:15]\r 46%|\u2588\u2588\u2588\u2588\u258c     | 46/100",
)


def startup_text() -> str:
    return "\n".join([
        format_dataset_lines("/workspace/tokenized_completions", 1095082),
        format_batches_line(59822, min_size=6, max_size=64, avg_size=18.3),
        format_bucket_table([0, 770, 1216, 1728, 2432, 3296, 8193], [2283, 4437, 6292, 9000, 9932, 27878]),
        format_loading_targets(5),
        *(format_target_on(i, f"cuda:{i}") for i in range(5)),
    ]) + "\n"


def prefetch_depth(rng: random.Random, capacity: int = 50) -> int:
    # a prefetch queue sits at its capacity and dips now and then, as in the seed's `[50, 50, 50, 49, 50]`
    return capacity if rng.random() < 0.8 else rng.randint(capacity - 5, capacity - 1)


def step_line(rng: random.Random, step: int) -> str:
    return format_step_line(StepRecord(
        elapsed_s=30.0 * step, step=step, loss=rng.uniform(2, 13), acc=rng.random(), streak=rng.uniform(0, 6),
        lr=4.52e-06, noise=0.0003, tgt_batches_per_s=rng.uniform(0.2, 0.4), dft_batches_per_s=0.29,
        tok_per_s=rng.uniform(9000, 14000), q_pre=[prefetch_depth(rng) for _ in range(5)],
        q_hs=[rng.randint(0, 20)], epoch=step / 59822, eta_s=rng.uniform(1e5, 1.1e6)))


def synthetic_log(n_steps: int, *, seed: int = 0) -> bytes:
    """Start-up, then n_steps step lines with a noise line every ~200 steps and a traceback every ~20K."""
    rng = random.Random(seed)
    parts = [startup_text()]
    for step in range(1, n_steps + 1):
        parts.append(step_line(rng, step) + "\n")
        if step % 200 == 0:
            parts.append(rng.choice(NOISE) + "\n")
        if step % 20000 == 0:
            parts.append(TRACEBACK)
    return "".join(parts).encode()


def parse_in_chunks(data: bytes, chunk: int) -> tuple[float, int, Counter]:
    parser = LogParser()
    kinds: Counter = Counter()
    view = memoryview(data)
    started, started_cpu = time.perf_counter(), time.process_time()
    for offset in range(0, len(data), chunk):
        kinds.update(map(type, parser.feed(view[offset:offset + chunk])))
    kinds.update(map(type, parser.flush()))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
    return seconds, cpu_seconds, parser.line_count, Counter({k.__name__: n for k, n in kinds.items()})


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--steps", type=int, default=1_000_000)
    options.add_argument("--chunk", type=int, default=64 * 1024)
    options.add_argument("--repeat", type=int, default=3)
    args = options.parse_args()
    data = synthetic_log(args.steps)
    print(f"log: {len(data) / 1e6:.1f} MB, chunks of {args.chunk} bytes")
    rates, cpu_rates = [], []
    for _ in range(args.repeat):
        seconds, cpu_seconds, lines, kinds = parse_in_chunks(data, args.chunk)
        rates.append(lines / seconds)
        cpu_rates.append(lines / cpu_seconds)
        print(f"  {lines} lines in {seconds:.2f} s wall, {cpu_seconds:.2f} s CPU = {rates[-1] / 1e3:.0f}K lines/s"
              f" ({cpu_rates[-1] / 1e3:.0f}K per CPU second)  {dict(kinds)}")
    print(f"best: {max(rates) / 1e3:.0f}K lines/s wall, {max(cpu_rates) / 1e3:.0f}K lines per CPU second "
          f"(goal >= 200K lines/s)")


if __name__ == "__main__":
    main()
