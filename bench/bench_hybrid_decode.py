"""A hybrid target's greedy and chain decoding, one prompt at a time against many at once (random weights, built in
memory: a 27B target is never written to disk).

    python bench/bench_hybrid_decode.py --model qwen3.6-27b --prompts 32 --old-prompts 8   # a GPU
    python bench/bench_hybrid_decode.py --model tiny-hybrid --device cpu                    # checks that it runs

One prompt at a time is the loop `trainer eval` ran for hybrids before: greedy token by token, then the chain with
the whole cache kept aside and the accepted tokens fed again after each refused draft. Many at once is
trainer/decoding/batched.py, its linear-attention states rewound row by row
(trainer/decoding/linear_state_rollback.py). The drafter is untrained,
so every round refuses its draft: the most rounds, and a rewind in each. Printed: tok/s of each way,
their ratio, and how many of the prompts both decoded came out identical (in bf16 a random target's near-uniform
logits tie often, and a verify pass rounds apart from one-token steps: `trainer eval` judges such divergences).
"""
from __future__ import annotations

import argparse
import sys
import time

from trainer_env import REPO_ROOT  # bench/ is on sys.path when one of its scripts runs

BLOCK, DRAFTER_LAYERS = 16, 5


def build(shape: str, device, dtype):
    import torch

    from synthetic import SHAPES, causal_lm_class, target_config
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.planning.taps import default_target_layer_ids

    config = target_config(SHAPES[shape], eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = causal_lm_class(config)._from_config(config, dtype=dtype).eval()
    drafter_config = DrafterConfig.from_target(
        config, num_layers=DRAFTER_LAYERS, block_size=BLOCK, mask_token_id=config.vocab_size - 1,
        target_layer_ids=default_target_layer_ids(config.num_hidden_layers, DRAFTER_LAYERS))
    drafter = DFlashDrafter(drafter_config, embed_tokens=model.get_input_embeddings(),
                            lm_head=model.get_output_embeddings())
    return model, drafter.to(device=device, dtype=dtype).eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3.6-27b", help="a hybrid shape of bench/synthetic.py")
    parser.add_argument("--prompts", type=int, default=32, help="prompts decoded at once (default 32)")
    parser.add_argument("--old-prompts", type=int, default=8, help="of them, decoded one at a time (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    import torch

    from trainer.decoding.batched import chain_proposer, decode_batch, greedy_proposer
    from trainer.decoding.speculative import LayerTaps, greedy_decode, speculative_decode

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    model, drafter = build(args.model, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    print(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e9:.1f}B parameters, "
          f"{model.dtype}, built in {time.perf_counter() - started:.0f}s", flush=True)
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    rng = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 300, (int(torch.randint(64, 257, (1,), generator=rng)),), generator=rng).tolist()
               for _ in range(args.prompts)]
    n = args.max_new_tokens

    def timed(decode):
        sync()
        begin = time.perf_counter()
        out = decode()
        sync()
        return out, time.perf_counter() - begin

    def batched(propose, rows):
        return timed(lambda: decode_batch(model, taps, rows, propose, max_new_tokens=n, eos_ids=set(),
                                          extra_positions=BLOCK).outputs)

    def one_by_one(decode, rows):
        return timed(lambda: [decode(ids) for ids in rows])

    greedy_one = lambda ids: greedy_decode(model, ids, max_new_tokens=n, eos_ids=set())  # noqa: E731
    chain_one = lambda ids: speculative_decode(model, drafter, taps, ids, max_new_tokens=n,  # noqa: E731
                                               eos_ids=set())
    started = time.perf_counter()  # first calls compile the linear-attention kernels for each shape
    batched(chain_proposer(drafter), prompts[:2])
    one_by_one(chain_one, prompts[:1])
    print(f"warm-up (kernel compiles): {time.perf_counter() - started:.0f}s", flush=True)
    old = prompts[:args.old_prompts]
    results = {}
    for name, propose, decode_one in (("greedy", greedy_proposer(), greedy_one),
                                      ("chain", chain_proposer(drafter), chain_one)):
        many, many_s = batched(propose, prompts)
        few, few_s = one_by_one(decode_one, old)
        same = sum(a.tokens == b.tokens for a, b in zip(many, few))
        results[name] = (len(prompts) * n / many_s, len(old) * n / few_s)
        print(f"{name}: {len(prompts)} at once {results[name][0]:.1f} tok/s ({many_s:.1f}s); one at a time "
              f"{results[name][1]:.1f} tok/s ({few_s:.1f}s for {len(old)}); {results[name][0] / results[name][1]:.1f}x; "
              f"identical {same}/{len(old)}", flush=True)
    taps.remove()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
