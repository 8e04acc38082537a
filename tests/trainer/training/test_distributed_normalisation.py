"""Under DDP each rank's loss is normalised by its share of the global batch's counts (distributed.rank_share): two
gloo ranks whose batches hold different numbers of supervised slots get, after DDP's gradient average, exactly the
gradient one process gets on both batches together. Normalising by each rank's own count (what the trainer did
before) gives another gradient, which the worker also checks, so the test shows the difference it guards."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.trainer.conftest import REPO_ROOT, trainer_env

WORKER = textwrap.dedent('''
    import json, sys
    import torch
    import torch.distributed as dist
    from trainer.training.distributed import compute_init, rank_share
    from trainer.training.losses import Objective, chunked_objective
    from trainer.training.objective import chunked_weighted_ce

    ctx = compute_init()
    slots, hidden_size, vocab = 4, 16, 24
    g = torch.Generator().manual_seed(7)
    head = torch.randn(vocab, hidden_size, generator=g)
    rows = [6 * slots, 10 * slots]                       # rank 0: 6 blocks, rank 1: 10
    hidden = [torch.randn(n, hidden_size, generator=g) for n in rows]
    labels = [torch.randint(0, vocab, (n,), generator=g) for n in rows]
    supervised = [torch.rand(n, generator=g) > p for n, p in zip(rows, (0.7, 0.1))]   # few against many
    decay = [torch.exp(-torch.arange(slots, dtype=torch.float32) / 3).repeat(n // slots) for n in rows]

    def loss_of(part, objective, share):
        h, y, s, d = part
        if objective == "ce":
            return chunked_weighted_ce(h, head, y, d * s, count_share=share).loss
        return chunked_objective(h, head, y, s, d, Objective({"ce": 1.0, "cap": 0.5}, objective), slots=slots,
                                 count_share=share).loss

    def gradient(part, objective, share):
        leaf = part[0].clone().requires_grad_()
        loss_of((leaf, *part[1:]), objective, share).backward()
        return leaf.grad

    out = {}
    for objective in ("ce", "dpace", "decay"):
        mine = (hidden[ctx.rank], labels[ctx.rank], supervised[ctx.rank], decay[ctx.rank])
        for name, share in (("global", lambda c: rank_share(c, ctx)), ("local", lambda c: c)):
            grad = gradient(mine, objective, share)
            padded = torch.zeros(max(rows), hidden_size)
            padded[:len(grad)] = grad / ctx.world_size          # DDP averages the ranks' gradients
            gathered = [torch.zeros_like(padded) for _ in range(ctx.world_size)]
            dist.all_gather(gathered, padded)
            out[f"{objective}/{name}"] = torch.cat([t[:n] for t, n in zip(gathered, rows)])
        whole = tuple(torch.cat(parts) for parts in (hidden, labels, supervised, decay))
        out[f"{objective}/one process"] = gradient(whole, objective, lambda c: c)
    if ctx.rank == 0:
        reference = {k.split("/")[0]: v for k, v in out.items() if k.endswith("one process")}
        print(json.dumps({key: (value - reference[key.split("/")[0]]).abs().max().item()
                          for key, value in out.items() if not key.endswith("one process")}))
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_two_ranks_with_uneven_batches_get_the_one_process_gradient(tmp_path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=240, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for objective in ("ce", "dpace", "decay"):
        assert errors[f"{objective}/global"] < 1e-5, errors
        assert errors[f"{objective}/local"] > 1e-3, errors   # each rank's own count: not the global batch's loss
