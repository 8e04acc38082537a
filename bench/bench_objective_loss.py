"""The chunked loss of each training objective alone (forward and the hidden states' gradient, as a step runs it),
against `ce` (the plain CE's own path), each chunked objective with its [rows, vocab] work eager beside compiled
(training/chunk_math.py), and against the distribution objectives' previous chunk loop (a second
product and log-softmax for the target's rows, autograd through the whole [rows, vocab] graph), in one process on
the same data. The target's rows are near the drafter's, so p and q overlap as in training.

    python bench/bench_objective_loss.py                  # GPU: 3072 blocks x 7 slots (block 8), Qwen3-8B's head
    python bench/bench_objective_loss.py --blocks 64 --hidden 32 --vocab 3000 --device cpu --repeat 2   # smoke
"""
from __future__ import annotations

import argparse
import json

import torch
from devicetime import timings

from trainer.training.losses import (ROW_VOCAB_PER_CHUNK, Normalisers, Objective, RowStats, acceptance_rate,
                                     chunk_terms, chunked_objective, forward_kl, needs)
from trainer.training.chunk_math import ChunkMath
from trainer.training.objective import chunked_weighted_ce

EAGER = ChunkMath(compiled=False)
OBJECTIVES = {"ce": ({"ce": 1.0}, "decay"), "ce+dpace": ({"ce": 1.0}, "dpace"), "kl": ({"kl": 1.0}, "dpace"),
              "lk_hybrid": ({"lk_hybrid": 1.0}, "dpace")}


def previous_objective(hidden, head, target, labels, supervised, decay, objective: Objective, slots: int):
    """The chunk loop of the distribution objectives before they shared the drafter's pass: (loss, grad)."""
    chunk_rows = max(1, ROW_VOCAB_PER_CHUNK // (head.shape[0] * slots)) * slots
    norms = Normalisers(slots=supervised.sum().float().clamp(min=1),
                        blocks=supervised.view(-1, slots).any(-1).sum().float().clamp(min=1))
    need_kl, _ = needs(objective)
    grad, total = torch.zeros_like(hidden), torch.zeros((), device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        piece = hidden[rows].detach().requires_grad_()
        with torch.enable_grad():
            logits = piece.to(head.dtype) @ head.t()
            log_q = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
            with torch.no_grad():
                log_p = torch.log_softmax(target[rows].to(head.dtype) @ head.t(), dim=-1, dtype=torch.float32)
            stats = RowStats(log_q.gather(1, labels[rows, None]).squeeze(1),
                             forward_kl(log_p, log_q) if need_kl else None, acceptance_rate(log_p, log_q))
            terms = chunk_terms(stats, supervised[rows], decay[rows], objective, slots, norms)
            loss = sum(objective.weights[name] * terms[name] for name in objective.weights)
            (grad[rows],) = torch.autograd.grad(loss, piece)
        logits.detach().argmax(dim=-1)
        total += loss.detach()
    return total, grad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=3072)
    parser.add_argument("--slots", type=int, default=7, help="drafted slots per block (block size - 1)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    rows = args.blocks * args.slots
    hidden = torch.randn(rows, args.hidden, device=device, generator=g).to(dtype).requires_grad_()
    target = (0.8 * hidden.detach() + 0.6 * torch.randn(rows, args.hidden, device=device, generator=g)).to(dtype)
    head = (torch.randn(args.vocab, args.hidden, device=device, generator=g) * 0.05).to(dtype)
    labels = torch.randint(0, args.vocab, (rows,), device=device, generator=g)
    supervised = torch.rand(rows, device=device, generator=g) > 0.1
    decay = torch.exp(-torch.arange(args.slots, device=device, dtype=torch.float32) / 7).repeat(args.blocks)
    figures = {}
    for name, (weights, slot_weights) in OBJECTIVES.items():
        objective = Objective(weights, slot_weights)

        def ours(math=None):
            if objective.is_plain_ce:
                return chunked_weighted_ce(hidden, head, labels, decay * supervised).loss
            return chunked_objective(hidden, head, labels, supervised, decay, objective, slots=args.slots,
                                     target_hidden=target, math=math).loss

        def step(math=None):
            ours(math).backward()
            hidden.grad = None
        row = {"ms": 1000 * min(timings(step, device, args.repeat))}
        if not objective.is_plain_ce:   # the chunks' [rows, vocab] work eager, as before it was compiled
            row["eager_ms"] = 1000 * min(timings(lambda: step(EAGER), device, args.repeat))
        if objective.needs_target_distribution:
            loss = ours()
            (grad,) = torch.autograd.grad(loss, hidden)
            before = previous_objective(hidden.detach(), head, target, labels, supervised, decay, objective, args.slots)
            row["previous_ms"] = 1000 * min(timings(
                lambda: previous_objective(hidden.detach(), head, target, labels, supervised, decay, objective,
                                           args.slots), device, args.repeat))
            row["loss_difference"] = abs(float(loss.detach()) - float(before[0]))
            row["grad_relative_difference"] = float((grad.float() - before[1].float()).norm() / before[1].float().norm())
        figures[name] = row
    for row in figures.values():
        row["over_ce"] = row["ms"] / figures["ce"]["ms"]
        for before in ("previous", "eager"):
            if f"{before}_ms" in row:
                row[f"{before}_over_ce"] = row[f"{before}_ms"] / figures["ce"]["ms"]
    print(json.dumps({"device": str(device), "device_name": torch.cuda.get_device_name(device)
                      if device.type == "cuda" else "cpu", "rows": rows, "vocab": args.vocab, "hidden": args.hidden,
                      "objectives": figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
