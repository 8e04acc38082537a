"""Where batched greedy decoding spends its time on an 8B-shape target (random weights, in memory)."""
import sys, time
import torch
sys.path.insert(0, ".")
from trainer.synthetic import SHAPES, target_config, causal_lm_class
from trainer.speculative import LayerTaps
from trainer.batchdecode import decode_batch, greedy_proposer

SHAPE, DEV = (sys.argv[1:] + ["qwen3-8b", "cuda"])[:2] if len(sys.argv) > 2 else ("qwen3-8b", "cuda")
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
torch.manual_seed(0)
config = target_config(SHAPES[SHAPE], eos_token_id=1, pad_token_id=0)
with torch.device(DEV):
    model = causal_lm_class(config)._from_config(config, dtype=torch.bfloat16).eval()
taps = LayerTaps(model, [1, 9, 17, 25, 33] if SHAPE == 'qwen3-8b' else [0, 1])
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(10, 300, (int(torch.randint(20, 50, (1,), generator=g)),), generator=g).tolist() for _ in range(40)]

def run(n, record_top):
    sync(); t = time.perf_counter()
    out = decode_batch(model, taps, prompts, greedy_proposer(), max_new_tokens=n, eos_ids=set(), extra_positions=0, record_top=record_top)
    sync(); return time.perf_counter() - t

import trainer.batchdecode as bd
new_rows = bd.top_logits_rows
def old_rows(logits):  # the previous way: a top-k and two host copies per position
    out = []
    for x in logits:
        v, i = x.float().topk(8); out.append((v.tolist(), i.tolist()))
    return out
run(8, True)
for label, fn, rt in (("old per-row top", old_rows, True), ("new batched top", new_rows, True), ("no top", new_rows, False)) * 2:
    bd.top_logits_rows = fn
    s = run(64, rt); print(f"greedy 40x64 {label}: {s:.2f}s, {s/64*1000:.1f} ms/step, {40*64/s:.0f} tok/s", flush=True)
bd.top_logits_rows = new_rows
