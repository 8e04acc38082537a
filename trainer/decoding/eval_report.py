"""What `trainer eval` reports: tau, per-position acceptance and speed of each decoding run (the drafter's chain,
an untrained baseline's chain, the drafter's trees), and how each run's output compares with greedy decoding.

tau is the mean number of tokens a verification forward kept, counted after the cut at max_new_tokens or an end
token. A round keeps its accepted drafts plus the target's bonus token, so `acceptance[k-1]`, the share of
rounds that kept at least k drafted tokens (k = 1..B-1), sums to tau - 1.

Precision. Speculative output must equal greedy output. In float32 that is checked exactly. In bfloat16 or
float16 a verify pass over many tokens rounds differently from one-token steps, so where the target's two best
tokens are nearly tied the two can pick differently: at the first token where a run leaves greedy, the margin
is greedy's logit of its own token minus its logit of the token the run chose. A margin within the precision's
rounding (at most 8 machine epsilons of the largest logit, at least of 1) is a precision note; a larger one, or
a token outside greedy's best 8, is a failure. A float32 hybrid target whose linear-attention layers run fla's
kernels on a GPU is judged at TF32's epsilon: those kernels take float32 inputs as TF32, so its chunked verify pass
and its one-token steps round apart as bf16 ones do, only less.
"""
from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field

import torch

from trainer.decoding.speculative import Decoded, DecodeRun

ROUNDING_EPSILONS = 8


@dataclass
class Divergence:
    run: str
    prompt: int
    position: int  # index of the first new token that differs from greedy's
    greedy_token: int
    token: int
    margin: float | None  # greedy's logit of its token minus that of the run's; None: not among its best 8
    tolerance: float | None  # the rounding bound; None in float32 (exact check)
    kind: str  # "precision" (a near-tie within rounding: a note) or "failure"

    def line(self) -> str:
        margin = "not among greedy's best 8" if self.margin is None else f"margin {self.margin:.4g}"
        bound = "" if self.tolerance is None or self.margin is None else \
            (" <= " if self.kind == "precision" else " > ") + f"{self.tolerance:.4g}"
        verdict = "precision note" if self.kind == "precision" else "FAILURE"
        return (f"  {self.run}, prompt {self.prompt}: first divergence at new token {self.position} "
                f"({self.token} for greedy's {self.greedy_token}), {margin}{bound}: {verdict}")


TF32_EPSILON = 2.0 ** -10  # TF32 keeps 10 of float32's 23 mantissa bits


def rounding_epsilon(dtype: torch.dtype, *, tf32_dots: bool = False) -> float | None:
    """The machine epsilon the target's logits are computed at; None where the check is exact (float32
    throughout). tf32_dots: a kernel of the target takes float32 inputs as TF32 (fla's delta rule on a GPU)."""
    if dtype == torch.float32:
        return TF32_EPSILON if tf32_dots else None
    return torch.finfo(dtype).eps if dtype.is_floating_point else None


def rounding_tolerance(epsilon: float | None, largest_logit: float) -> float | None:
    return None if epsilon is None else ROUNDING_EPSILONS * epsilon * max(1.0, abs(largest_logit))


def divergence(run: str, prompt: int, tokens: list[int], greedy: Decoded, epsilon: float | None) -> Divergence | None:
    """The first place `tokens` leave greedy's output, judged by greedy's logits there; None if identical."""
    if tokens == greedy.tokens:
        return None
    position = next((i for i, (a, b) in enumerate(zip(tokens, greedy.tokens)) if a != b),
                    min(len(tokens), len(greedy.tokens)))
    if position >= len(tokens) or position >= len(greedy.tokens):  # one stopped early: no near-tie explains it
        return Divergence(run, prompt, position, -1, -1, None, None, "failure")
    values, ids = greedy.top[position] if position < len(greedy.top) else ([0.0], [greedy.tokens[position]])
    token = tokens[position]
    margin = values[0] - values[ids.index(token)] if token in ids else None
    tolerance = rounding_tolerance(epsilon, values[0])
    near_tie = margin is not None and tolerance is not None and margin <= tolerance
    return Divergence(run, prompt, position, greedy.tokens[position], token, margin, tolerance,
                      "precision" if near_tie else "failure")


def acceptance(rounds: list[int], block_size: int) -> list[float]:
    """Share of rounds that kept at least k drafted tokens, k = 1..block_size-1 (a round keeps drafts + 1)."""
    if not rounds:
        return [0.0] * (block_size - 1)
    return [sum(n - 1 >= k for n in rounds) / len(rounds) for k in range(1, block_size)]


@dataclass
class RunSummary:
    name: str  # "drafter", "baseline", "drafter tree 32"
    budget: int | None  # the tree's node budget; None for a chain
    tau: float
    rounds: int
    rejected_rounds: int
    new_tokens: int
    tok_per_s: float
    acceptance: list[float]
    identical_to_greedy: bool
    mismatched_prompts: list[int]
    divergences: list[Divergence] = field(default_factory=list)


def summarize(name: str, run: DecodeRun, greedy: DecodeRun, *, epsilon: float | None, block_size: int,
              budget: int | None = None) -> RunSummary:
    rounds = run.rounds
    found = [divergence(name, i, out.tokens, ref, epsilon) for i, (out, ref) in enumerate(zip(run.outputs,
                                                                                            greedy.outputs))]
    found = [d for d in found if d is not None]
    return RunSummary(
        name=name, budget=budget, tau=sum(rounds) / len(rounds) if rounds else 0.0, rounds=len(rounds),
        rejected_rounds=sum(out.rejected_rounds for out in run.outputs), new_tokens=run.new_tokens,
        tok_per_s=run.tok_per_s(), acceptance=acceptance(rounds, block_size), identical_to_greedy=not found,
        mismatched_prompts=[d.prompt for d in found], divergences=found)


@dataclass
class EvalReport:
    prompts: int
    max_new_tokens: int
    dtype: str
    device: str
    batch_size: int  # prompts decoded at once; 1 on targets decoded one prompt at a time
    block_size: int
    greedy_tok_per_s: float
    drafter: RunSummary  # the trained drafter's chain
    baseline: RunSummary | None  # an untrained drafter of the same shape, its chain
    trees: list[RunSummary]  # the trained drafter's trees, one per budget
    tf32_dots: bool = False  # float32, but a kernel of the target (fla's delta rule) computes its dots in TF32

    # the drafter's chain under the names of the first version, for Python callers
    tau = property(lambda self: self.drafter.tau)
    rounds = property(lambda self: self.drafter.rounds)
    identical_to_greedy = property(lambda self: self.drafter.identical_to_greedy)
    speculative_tok_per_s = property(lambda self: self.drafter.tok_per_s)

    @property
    def precision(self) -> str:
        return f"{self.dtype} (fla's delta rule in TF32)" if self.tf32_dots else self.dtype

    def runs(self) -> list[RunSummary]:
        return [self.drafter, *([self.baseline] if self.baseline else []), *self.trees]

    def divergences(self, kind: str) -> list[Divergence]:
        return [d for run in self.runs() for d in run.divergences if d.kind == kind]

    @property
    def ok(self) -> bool:
        """No real failure (precision notes are allowed): the exit code."""
        return not self.divergences("failure")

    def as_dict(self) -> dict:
        chain = self.drafter
        return {
            # the drafter's chain, under the keys of the first version
            "prompts": self.prompts, "new_tokens": chain.new_tokens, "tau": chain.tau, "rounds": chain.rounds,
            "rejected_rounds": chain.rejected_rounds, "speculative_tok_per_s": chain.tok_per_s,
            "greedy_tok_per_s": self.greedy_tok_per_s, "identical_to_greedy": chain.identical_to_greedy,
            "mismatched_prompts": chain.mismatched_prompts, "acceptance": chain.acceptance,
            "baseline": asdict(self.baseline) if self.baseline else None,
            "trees": [asdict(tree) for tree in self.trees],
            "precision_notes": [asdict(d) for d in self.divergences("precision")],
            "failures": [asdict(d) for d in self.divergences("failure")], "ok": self.ok,
            "max_new_tokens": self.max_new_tokens, "dtype": self.dtype, "device": self.device,
            "batch_size": self.batch_size, "block_size": self.block_size, "tf32_dots": self.tf32_dots,
        }

    def lines(self) -> list[str]:
        how = f"{self.batch_size} prompts at a time" if self.batch_size > 1 else "one prompt at a time"
        lines = [f"Prompts: {self.prompts}, up to {self.max_new_tokens} new tokens each; target in {self.precision} "
                 f"on {self.device}, decoded {how}",
                 f"{'run':<20}{'tau':>7}{'rounds':>8}{'rejected':>10}{'tok/s':>10}{'vs greedy':>11}  output",
                 f"{'greedy':<20}{'-':>7}{'-':>8}{'-':>10}{self.greedy_tok_per_s:>10.1f}{'1.00x':>11}"]
        for run in self.runs():
            speedup = run.tok_per_s / self.greedy_tok_per_s if self.greedy_tok_per_s else 0.0
            output = "identical" if run.identical_to_greedy else f"differs on {len(run.mismatched_prompts)} prompt(s)"
            lines.append(f"{run.name:<20}{run.tau:>7.3f}{run.rounds:>8}{run.rejected_rounds:>10}"
                         f"{run.tok_per_s:>10.1f}{speedup:>10.2f}x  {output}")
        lines.append("Per-position acceptance: share of rounds that kept at least k drafted tokens")
        lines.append(f"{'k':<20}" + "".join(f"{k:>6}" for k in range(1, self.block_size)))
        lines += [f"{run.name:<20}" + "".join(f"{share:>6.2f}" for share in run.acceptance) for run in self.runs()]
        return lines + self._verdict_lines()

    def _verdict_lines(self) -> list[str]:
        notes, failures = self.divergences("precision"), self.divergences("failure")
        if not notes and not failures:
            return ["Output identical to greedy decoding: yes"]
        lines = [f"Divergences from greedy ({self.precision}): {len(failures)} failure(s), {len(notes)} precision "
                 f"note(s) (a near-tie: margin within {ROUNDING_EPSILONS} epsilons of the largest logit)"]
        lines += [d.line() for d in failures]
        for run in self.runs():
            mine = [f"prompt {d.prompt} at token {d.position} (margin {d.margin:.3g})" for d in run.divergences
                    if d.kind == "precision"]
            if mine:
                lines += textwrap.wrap(f"{run.name} notes: " + ", ".join(mine), width=116, initial_indent="  ",
                                       subsequent_indent="    ")
        if failures:
            return lines + [f"Output identical to greedy decoding: NO ({len(failures)} real divergence(s))"]
        return lines + [f"Output identical to greedy decoding: up to {self.precision} rounding (each divergence is a "
                        f"near-tie of the target's two best tokens)"]
