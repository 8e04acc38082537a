"""Batched greedy decoding on an 8B-shape target (random weights, built in memory), with greedy's top logits
recorded per row (the way before), per round (now) and not at all: what `greedy-top-8b.txt` holds. Run from the
repository's root: `python bench/h200-2026-12-02e/greedy_profile.py [SHAPE DEVICE]` (default qwen3-8b cuda; `tiny
cpu` checks it runs). `greedy-profile-8b.txt` came from an earlier version that also timed a bare transformers
loop and printed torch.profiler's tables of 16 rounds."""
import sys
import time

import torch

sys.path.insert(0, ".")
from bench.synthetic import SHAPES, causal_lm_class, target_config  # noqa: E402
import trainer.decoding.batched as bd  # noqa: E402
from trainer.decoding.speculative import LayerTaps  # noqa: E402

SHAPE, DEV = sys.argv[1:3] if len(sys.argv) > 2 else ("qwen3-8b", "cuda")
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
torch.manual_seed(0)
config = target_config(SHAPES[SHAPE], eos_token_id=1, pad_token_id=0)
with torch.device(DEV):
    model = causal_lm_class(config)._from_config(config, dtype=torch.bfloat16).eval()
taps = LayerTaps(model, [1, 9, 17, 25, 33] if SHAPE == "qwen3-8b" else [0, 1])
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(10, 300, (int(torch.randint(20, 50, (1,), generator=g)),), generator=g).tolist()
           for _ in range(40)]


def run(n, record_top):
    sync()
    started = time.perf_counter()
    bd.decode_batch(model, taps, prompts, bd.greedy_proposer(), max_new_tokens=n, eos_ids=set(), extra_positions=0,
                    record_top=record_top)
    sync()
    return time.perf_counter() - started


def old_rows(logits):  # the previous way: a top-k and two host copies per position
    out = []
    for x in logits:
        values, ids = x.float().topk(8)
        out.append((values.tolist(), ids.tolist()))
    return out


new_rows = bd.top_logits_rows
run(8, True)
for label, rows, record in (("old per-row top", old_rows, True), ("new batched top", new_rows, True),
                            ("no top", new_rows, False)) * 2:
    bd.top_logits_rows = rows
    s = run(64, record)
    print(f"greedy 40x64 {label}: {s:.2f}s, {s / 64 * 1000:.1f} ms/step, {40 * 64 / s:.0f} tok/s", flush=True)
bd.top_logits_rows = new_rows
