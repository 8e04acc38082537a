"""The memory plan of one training rank, from the target's config.json and the training config alone (torch-free:
no weight is read, nothing is allocated), printed at start-up and refused before loading when it cannot fit.

Bytes per rank, in the order the trainer allocates them:
- target: every parameter of the language model (a composite checkpoint's vision tower is never loaded), in
  the target dtype (trainer/planning/target_size.py counts them).
- drafter: fp32 master weights and their fp32 gradients, whole on every rank (DDP's buckets are the gradients).
- optimizer: AdamW's two fp32 states, of the largest rank's share when they are sharded (ZeRO-1); of rank 0's,
  the share it holds, when one process simulates rank 0 of N.
- activations at the token budget: the largest of three phases.
  target phase: the tapped features of the previous step, still held, plus the tapped list and its
  concatenation (3 x taps x hidden per token), plus one target layer's working set.
  drafter phase: the tapped features, what autograd saves for backward (trainer/planning/drafter_bytes.py, per block
  token and per key/value token, with the kernels the run uses: the drafter's torch code or liger-kernel's; on
  the CPU it equals what saved-tensor hooks count in a real step, see the tests), the autocast's bf16 copies of
  the drafter's weights, and a working set (what the backward holds above the saved tensors,
  drafter_bytes.backward_working_bytes, or the loss's chunk of logits, whichever is larger). An objective other
  than plain CE (trainer/training/losses.py) holds more per chunk (its own autograd graph); one against the
  target's distribution also holds the target's final hidden states and their rows at the slots, and its chunk
  holds the target's logits and probabilities beside the drafter's.
  checkpoint phase (sharded): AdamW's shards pass through every rank's device on their way to rank 0.
- reserve: a fixed allowance for the CUDA context, NCCL buffers and allocator fragmentation.

Every token count is per rank: token_budget tokens of target context and up to anchor_budget x block_size
block tokens for the drafter.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainer.errors import TrainerError
from trainer.planning.drafter_bytes import DrafterSizes, Precision, backward_working_bytes, drafter_saved_bytes
from trainer.planning.target_families import TargetSpec, read_target_spec
from trainer.planning.target_size import target_layer_working_bytes, target_params

GIB = 2 ** 30
RESERVE_BYTES = 4 * GIB          # CUDA context (~0.5 GiB), NCCL buffers, allocator fragmentation
FP32 = 4
LOGITS_PER_CHUNK = 2 ** 27       # objective.LOGITS_PER_CHUNK: rows of logits per chunk of the loss
ROW_VOCAB_PER_CHUNK = 2 ** 26    # losses.ROW_VOCAB_PER_CHUNK: the other objectives' chunk
# [rows, vocab] tensors a chunk of those objectives holds at its peak: logits (activation dtype) and fp32
# log-probabilities, the softmax and the logits' gradient; against the target's distribution its rows stacked
# under the drafter's (logits, log p, p) and the KL or overlap terms
LABEL_CHUNK_TENSORS = (1, 4)         # (activation dtype, fp32)
DISTRIBUTION_CHUNK_TENSORS = (2, 8)


# ---------------------------------------------------------------------------------------------- drafter

def zero_partition(numels: list[int], ways: int) -> list[list[int]]:
    """Parameter indices per rank, as torch's ZeroRedundancyOptimizer partitions one parameter group: largest
    first (equal sizes in their order), each to the rank with the fewest elements so far (ties: lowest rank)."""
    sizes, parts = [0] * ways, [[] for _ in range(ways)]
    for index in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):
        rank = min(range(ways), key=lambda r: sizes[r])
        parts[rank].append(index)
        sizes[rank] += numels[index]
    return [sorted(part) for part in parts]



# ---------------------------------------------------------------------------------------------- the plan

@dataclass
class MemoryPlan:
    """Bytes per rank; `limit` is the GPU's memory (None: not checked, e.g. on the CPU)."""

    target_name: str
    target_params: int
    drafter_params: int
    optimizer_params: int      # parameters whose AdamW states the rank keeps (the largest share; rank 0's if simulated)
    ways: int                  # how many ways the states are split (1: whole)
    tokens: int
    block_tokens: int
    target_bytes: int
    drafter_bytes: int         # fp32 weights + fp32 gradients
    optimizer_bytes: int
    activations: dict[str, int] = field(default_factory=dict)   # the peak phase's parts
    phase: str = "drafter"
    reserve: int = RESERVE_BYTES
    limit: int | None = None
    world_size: int = 1
    simulated: bool = False
    kernels: str = "torch"     # the drafter's RMSNorm and SwiGLU the activations assume (drafter_bytes.KERNELS)
    on_gpu: bool = True        # False: a CPU run, whose memory is the process's and needs no CUDA allowance

    @property
    def activation_bytes(self) -> int:
        return sum(self.activations.values())

    @property
    def total(self) -> int:
        return self.target_bytes + self.drafter_bytes + self.optimizer_bytes + self.activation_bytes + self.reserve

    @property
    def fits(self) -> bool:
        return self.limit is None or self.total <= self.limit

    def lines(self) -> list[str]:
        shards = "whole" if self.ways == 1 else f"sharded {self.ways} ways"
        who = (f"rank 0 of {self.ways}, simulated" if self.simulated else
               f"one of {self.world_size} ranks" if self.world_size > 1 else "one rank")
        verdict = ("limit not checked" if self.limit is None else
                   f"fits {_gib(self.limit)} GiB, {_gib(self.limit - self.total)} GiB spare" if self.fits else
                   f"does NOT fit {_gib(self.limit)} GiB: {_gib(self.total - self.limit)} GiB over")
        parts = ", ".join(f"{name} {_gib(value)}" for name, value in self.activations.items())
        where = "per GPU" if self.on_gpu else "of the CPU process"
        lines = [
            f"Memory plan {where} ({who}): {_gib(self.total)} GiB, {verdict}",
            f"  target      {_gib(self.target_bytes):>7} GiB  {self.target_name}, {_params(self.target_params)}",
            f"  drafter     {_gib(self.drafter_bytes):>7} GiB  {_params(self.drafter_params)}, fp32 weights + grads",
            f"  optimizer   {_gib(self.optimizer_bytes):>7} GiB  AdamW states {shards} "
            f"({_params(self.optimizer_params)} on {'rank 0' if self.simulated else 'the largest rank'})",
            f"  activations {_gib(self.activation_bytes):>7} GiB  {self.tokens} tokens, {self.block_tokens} block "
            f"tokens, {self.kernels} kernels; {self.phase} phase: {parts}",
        ]
        if self.reserve:
            lines.append(f"  reserve     {_gib(self.reserve):>7} GiB  CUDA context, NCCL, allocator")
        return lines

    def refusal(self, fitting_budget: int) -> str:
        """One line: what does not fit and what to change (fitting_budget: the largest token_budget that fits
        as it is, 0 if none does)."""
        fixes = [f"token_budget: {fitting_budget}"] if fitting_budget else []
        if self.ways == 1 and self.world_size > 1:
            fixes.append("shard_optimizer: true")
        fixes.append("more GPUs")
        return (f"memory plan: {_gib(self.total)} GiB per GPU does not fit its {_gib(self.limit)} GiB "
                f"({_gib(self.total - self.limit)} GiB over); "
                + ("" if fitting_budget else "no token_budget fits as it is; ") + "use " + ", or ".join(fixes))


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def loss_chunk_bytes(objective: str, precision: Precision, hidden_size: int, block_tokens: int) -> int:
    """The loss's working set: one chunk and the gradient of the drafter's hidden states. `objective`: "ce" (the
    plain CE's own path), "labels" (another objective on the data's tokens) or "distribution" (one against the
    target's distribution)."""
    grad = FP32 * hidden_size * block_tokens
    if objective == "ce":
        return LOGITS_PER_CHUNK * (precision.act + FP32) + grad
    act, fp32 = DISTRIBUTION_CHUNK_TENSORS if objective == "distribution" else LABEL_CHUNK_TENSORS
    return ROW_VOCAB_PER_CHUNK * (act * precision.act + fp32 * FP32) + grad


def _params(count: int) -> str:
    """`8.19B params`, `0.22B params`, `1.25M params`: a tiny model's count is not `0.00B`."""
    for smallest, scale, unit in ((1e8, 1e9, "B"), (1e4, 1e6, "M")):
        if count >= smallest:
            return f"{count / scale:.2f}{unit} params"
    return f"{count} params"


def plan(text: dict, drafter: DrafterSizes, *, tokens: int, block_tokens: int, ways: int, precision: Precision,
         world_size: int = 1, limit: int | None = None, simulated: bool = False,
         kernels: str = "torch", objective: str = "ce") -> MemoryPlan:
    """The plan of one rank for a target text config and a drafter at `tokens` target tokens per step, whose
    RMSNorm and SwiGLU run `kernels` ("torch" or "liger", as kernels.resolve answers), trained for `objective`
    (loss_chunk_bytes)."""
    numels = drafter.param_numels()
    n_drafter = sum(numels)
    shares = [sum(numels[i] for i in part) for part in zero_partition(numels, ways)]
    share = shares[0] if simulated else max(shares)
    features = precision.act * drafter.num_taps * drafter.hidden_size * tokens
    backward = backward_working_bytes(drafter, precision, context_tokens=tokens, block_tokens=block_tokens,
                                      kernels=kernels)
    loss_chunk = loss_chunk_bytes(objective, precision, drafter.hidden_size, block_tokens)
    # the target's final hidden states ([tokens, H], kept for the loss) and their rows at the slots
    final = precision.act * drafter.hidden_size * (tokens + block_tokens) if objective == "distribution" else 0
    drafter_phase = {
        "features": features,
        "saved": drafter_saved_bytes(drafter, precision, context_tokens=tokens, block_tokens=block_tokens,
                                     kernels=kernels),
        "bf16 weights": 2 * drafter.matmul_params() if precision.casts else 0,
        "working": max(backward, loss_chunk),
        "target final states": final,
    }
    target_phase = {"features": 3 * features, "target final states": final,
                    "target layer": target_layer_working_bytes(text, precision.target) * tokens}
    # between steps, a checkpoint gathers the shards through every rank's device: two copies of a share
    checkpoint_phase = {"features": features, "gathered shards": 2 * 2 * FP32 * share if ways > 1 else 0}
    phases = {"drafter": drafter_phase, "target": target_phase, "checkpoint": checkpoint_phase}
    phase = max(phases, key=lambda name: sum(phases[name].values()))
    n_target = target_params(text)
    return MemoryPlan(
        target_name=str(text.get("model_type", "target")), target_params=n_target, drafter_params=n_drafter,
        optimizer_params=share, ways=ways, tokens=tokens, block_tokens=block_tokens,
        target_bytes=precision.target * n_target, drafter_bytes=2 * FP32 * n_drafter,
        optimizer_bytes=2 * FP32 * share, activations={k: v for k, v in phases[phase].items() if v},
        phase=phase, limit=limit, world_size=world_size, simulated=simulated, kernels=kernels)


def largest_fitting_budget(build, budget: int, *, smallest: int) -> int:
    """The largest token budget in [smallest, budget) whose plan fits (build(tokens) -> MemoryPlan); 0: none."""
    if not build(smallest).fits:
        return 0
    low, high = smallest, budget
    while high - low > 256:
        middle = (low + high) // 2
        low, high = (middle, high) if build(middle).fits else (low, middle)
    return low // 256 * 256 or low


# ---------------------------------------------------------------------------------------------- from a config

def sharding_ways(shard_optimizer: bool | str, world_size: int) -> int:
    """How many ways AdamW's states are split: the world size when sharding is on (auto: several ranks)."""
    on = world_size > 1 if shard_optimizer == "auto" else bool(shard_optimizer)
    return world_size if on else 1


def max_block_tokens(cfg, tokens: int) -> int:
    """The most block tokens one batch gives the drafter: per bucket, its batch size times the anchors each of
    its sequences may draw (num_anchors, the positions of its longest sample, the anchor_budget's share)."""
    anchor_budget = cfg.anchor_budget
    if anchor_budget == max(1, cfg.token_budget // cfg.block_size):  # the default, which follows token_budget
        anchor_budget = max(1, tokens // cfg.block_size)
    most = 0
    for high in cfg.buckets[1:]:
        longest = min(high - 1, cfg.max_length or high - 1)
        batch = max(1, tokens // max(1, high - 1))
        per_sequence = min(cfg.num_anchors, max(1, longest - 1))
        if anchor_budget:
            per_sequence = min(per_sequence, max(1, anchor_budget // batch))
        most = max(most, batch * per_sequence)
    return most * cfg.block_size


def config_plan(cfg, *, world_size: int, limit: int | None, on_gpu: bool, tokens: int | None = None,
                spec: TargetSpec | None = None, text: dict | None = None,
                drafter: DrafterSizes | None = None, kernels: str = "torch") -> MemoryPlan:
    """The plan of one rank of a run of `cfg` (a TrainConfig) on `world_size` ranks of `limit` bytes each, its
    drafter running `kernels` (resolved: "torch" or "liger"). The target is read from cfg.target_path's
    config.json unless given (`spec`, or its text config and the drafter's sizes, as the bench has them)."""
    if text is None or drafter is None:
        spec = spec or read_target_spec(cfg.target_path)
        text = text or spec.text
    tokens = tokens or cfg.token_budget
    taps = len(cfg.target_layer_ids) if cfg.target_layer_ids else cfg.drafter_layers
    drafter = drafter or DrafterSizes.for_run(spec, cfg, num_taps=taps)
    ways = cfg.simulate_shards or sharding_ways(cfg.shard_optimizer, world_size)
    memory = plan(text, drafter, tokens=tokens, block_tokens=max_block_tokens(cfg, tokens), ways=ways,
                  precision=Precision.of_run(cfg.dtype, on_gpu), world_size=world_size, limit=limit,
                  simulated=bool(cfg.simulate_shards), kernels=kernels, objective=objective_kind(cfg))
    return memory if on_gpu else dataclasses.replace(memory, reserve=0, on_gpu=False)


def objective_kind(cfg) -> str:
    """What the loss of `cfg` holds (loss_chunk_bytes): "ce", "labels" or "distribution"."""
    if cfg.needs_target_distribution():
        return "distribution"
    return "ce" if cfg.loss_weights() == {"ce": 1.0} and cfg.slot_weights == "decay" else "labels"


def refusal(cfg, memory: MemoryPlan, *, on_gpu: bool) -> str:
    """The one line that refuses `memory`, with the largest token_budget that would fit."""
    spec = read_target_spec(cfg.target_path)
    longest = cfg.buckets[-1] - 1

    def build(tokens: int) -> MemoryPlan:
        return config_plan(cfg, world_size=memory.world_size, limit=memory.limit, on_gpu=on_gpu, tokens=tokens,
                           spec=spec, kernels=memory.kernels)

    budget = largest_fitting_budget(build, cfg.token_budget, smallest=longest) if longest < cfg.token_budget else 0
    return memory.refusal(budget)


def check(cfg, *, world_size: int, limit: int | None, on_gpu: bool, say, kernels: str = "torch") -> MemoryPlan:
    """Print this rank's plan (`say` prints on rank 0 only) for a drafter running `kernels` (resolved); a
    TrainerError (exit 2) when it exceeds `limit`, raised on every rank, before the target is loaded."""
    if cfg.simulate_shards and world_size > 1:
        raise TrainerError(f"simulate_shards: {cfg.simulate_shards} is a memory check for one process; this run "
                           f"has {world_size}: remove simulate_shards (shard_optimizer shards for real)")
    memory = config_plan(cfg, world_size=world_size, limit=limit, on_gpu=on_gpu, kernels=kernels)
    say(*memory.lines())
    if not memory.fits:
        raise TrainerError(refusal(cfg, memory, on_gpu=on_gpu))
    return memory
