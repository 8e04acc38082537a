"""The training config: one pydantic model, loaded from YAML, every field documented (torch-free).

Unknown keys are refused with the key's name and the closest known name, so a typo never silently falls back
to a default. Every problem of a config is reported at once, one line each, each naming its key.
Relative paths are taken from the working directory the trainer was started in, or from `train --base-dir`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from trainer.errors import ConfigError, Problem, TrainerError
from trainer.objectives import (DEFAULT_DPACE_ALPHA, DEFAULT_LOSS, DEFAULT_SLOT_WEIGHTS, DISTRIBUTION_OBJECTIVES,
                                parse_loss)

# The seed run's length buckets (upper bounds exclusive): they spread a chat dataset's batches evenly enough.
SEED_BUCKETS = [0, 770, 1216, 1728, 2432, 3296, 8193]
# DFLASH.md: loss decay gamma per block size.
GAMMA_BY_BLOCK_SIZE = {16: 7.0, 10: 5.0, 8: 4.0}
# The node budgets `trainer eval --tree-budget` is usually run at: small, where speed-up peaks, and large.
DEFAULT_TREE_BUDGETS = (8, 32, 64)
# The replay keeps this many best tokens per slot of every held-out anchor: a bound on its memory.
MAX_TREE_BUDGET = 1024
# The drafter architectures and what each defaults to (DFLASH.md: DFlash B=16; DFlash2 B=8, a two-tap convolution
# shared by groups of 16 channels, a rank-256 selector over the top 16 candidates of every slot).
BLOCK_SIZE_DEFAULTS = {"dflash": 16, "dflash2": 8}
DFLASH2_DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
CONV_KERNEL_SIZES = (2,)   # the published convolution's taps (slot t and t - 1); others are untested
# Names other trainers use for our keys, where the closest spelling would point elsewhere (or nowhere).
KEY_ALIASES = {alias: key for key, names in {
    "lr": "learning_rate", "token_budget": "batch_size max_tokens tokens_per_batch",
    "target_path": "model model_path target model_name_or_path", "data_path": "data dataset_path train_data",
    "output_dir": "output_path out_dir save_dir", "epochs": "num_train_epochs",
    "max_steps": "steps num_steps train_steps", "warmup_ratio": "warmup_steps",
    "grad_clip": "max_grad_norm clip_grad_norm", "max_length": "max_seq_len max_seq_length seq_len",
    "drafter_layers": "num_layers", "checkpoint_every": "save_steps save_every", "log_every": "logging_steps",
    "resume": "resume_from_checkpoint", "compile": "torch_compile", "weight_decay": "wd",
    "loss": "loss_fn objective loss_type", "slot_weights": "loss_weights per_position_loss_weight",
    "drafter_heads": "num_attention_heads", "drafter_kv_heads": "num_key_value_heads",
    "drafter_head_dim": "head_dim", "drafter_intermediate_size": "intermediate_size",
    "drafter_rope_theta": "rope_theta"
}.items() for alias in names.split()}


def default_gamma(block_size: int) -> float:
    """DFLASH.md's gamma for B=16/10/8; for other sizes B/2 - 1 (which gives 7 for 16), at least 1."""
    return GAMMA_BY_BLOCK_SIZE.get(block_size, max(1.0, block_size / 2 - 1))


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_path: str = Field(description="Local Hugging Face causal LM directory (config.json + weights + tokenizer).")
    data_path: str = Field(description="Dataset directory written by `python -m trainer prepare` "
                                       "(Arrow, columns input_ids and loss_mask).")
    output_dir: str = Field(description="Where metrics.jsonl and the step_N/ checkpoints are written.")
    max_steps: int = Field(0, ge=0, description="Optimizer steps to run; 0 = run `epochs` epochs.")
    epochs: int = Field(1, ge=1, description="Epochs over the dataset when max_steps is 0.")
    architecture: Literal["dflash", "dflash2"] = Field(
        "dflash", description="Drafter architecture: dflash, or dflash2 (DFlash plus a two-tap dynamic convolution "
                              "around every sublayer and a path selector over each slot's top candidates).")
    block_size: int | None = Field(None, ge=2, description="Slots per drafted block B (slot 0 = anchor token); "
                                                           "default 16 for dflash, 8 for dflash2.")
    conv_kernel_size: int | None = Field(None, ge=1, description="dflash2: taps of the block convolution "
                                                                 "(default 2: slot t and t-1).")
    conv_group_size: int | None = Field(None, ge=1, description="dflash2: channels that share one dynamic kernel "
                                                                "correction (default 16; divides the hidden size).")
    selector_rank: int | None = Field(None, ge=1, description="dflash2: rank of the selector's pair scores "
                                                              "(default 256).")
    selector_top_k: int | None = Field(None, ge=1, description="dflash2: candidates per slot the selector "
                                                               "chooses among (default 16).")
    num_anchors: int = Field(512, ge=1, description="Most anchors (blocks) sampled per sequence per step.")
    anchor_budget: int | None = Field(
        None, ge=0, description="Most blocks per batch: a batch of n sequences samples min(num_anchors, "
                                "anchor_budget // n) per sequence. Default: token_budget // block_size, so the "
                                "drafter never runs more block tokens than the target ran tokens (its memory "
                                "grows with blocks x block_size); 0 = no cap.")
    gamma: float | None = Field(None, gt=0, description="Decay slot weights: slot k weighs exp(-(k-1)/gamma). "
                                                         "Default 7 for B=16, 5 for B=10, 4 for B=8.")
    loss: str | dict[str, float] = Field(
        DEFAULT_LOSS, description="Training objective: ce (cross-entropy on the data's tokens), cap (expected "
                          "accepted prefix of each block under greedy verification, CE mixed in while acceptance is "
                          "low), or against the target's own distribution: kl (forward KL), tv (1 - acceptance "
                          "rate), nla (-log acceptance rate), lk_hybrid (KL and TV blended by acceptance). A mapping "
                          "weighs several, e.g. {ce: 0.1, cap: 0.9}; each term is logged apart (loss_ce, ...). "
                          "kl/tv/nla/lk_hybrid also run the target's layers past the last tap and its LM head.")
    slot_weights: Literal["decay", "dpace"] = Field(
        DEFAULT_SLOT_WEIGHTS, description="How the per-slot terms weigh a block's slots: dpace (D-PACE: each slot's share of the "
                             "block's expected accepted length, from the drafter's detached confidence in the "
                             "target's token; the default, chosen by bench/bench_objectives.py: +15-24 % decoded "
                             "chain τ over decay on two seeds) or decay (exp(-(k-1)/gamma), the first DFlash recipe).")
    dpace_alpha: float = Field(DEFAULT_DPACE_ALPHA, ge=0, le=1, description="D-PACE's confidence smoothing: a slot's confidence "
                                                            "q becomes (1 - alpha) q + alpha.")
    drafter_layers: int = Field(5, ge=1, description="Decoder layers of the drafter; also the number of "
                                                     "tapped target layers when target_layer_ids is unset.")
    target_layer_ids: list[int] | None = Field(
        None, description="Target layers whose outputs feed the drafter. Default: drafter_layers taps spread "
                          "evenly from layer 1 to N-3 (N//2 for one tap).")
    token_budget: int = Field(49152, ge=1, description="Tokens per batch: a batch of bucket [lo, hi) holds "
                                                       "floor(token_budget / (hi - 1)) samples.")
    buckets: list[int] = Field(default_factory=lambda: list(SEED_BUCKETS),
                               description="Length bucket boundaries, ascending; the last one is exclusive.")
    max_length: int | None = Field(None, ge=2, description="Longest sample in tokens; default: the last bucket - 1.")
    overlong: Literal["truncate", "drop"] = Field("truncate", description="What to do with samples longer "
                                                                          "than max_length.")
    lr: float = Field(6e-4, gt=0, description="Peak learning rate (AdamW).")
    warmup_ratio: float = Field(0.04, ge=0, le=1, description="Share of steps with linear warmup; cosine decay to 0.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0, description="Max global gradient norm; 0 disables clipping.")
    noise: float = Field(0.0, ge=0, description="Std of Gaussian noise added to target features (0 = off).")
    log_every: int = Field(10, ge=1, description="Steps between step lines (stdout + metrics.jsonl).")
    checkpoint_every: int = Field(1000, ge=0, description="Steps between checkpoints (0 = only at the end).")
    keep_checkpoints: int = Field(3, ge=0, description="Newest step_N/ checkpoints kept (0 = keep all).")
    on_disk_full: Literal["skip", "stop"] = Field("skip", description="A checkpoint the disk has no room for: skip = "
                                                  "log it and keep training; stop = end the run (exit 1).")
    seed: int = Field(0, description="Seed of weights init, data order, anchors and noise.")
    compile: bool = Field(False, description="torch.compile the drafter (batches are then padded to the "
                                             "bucket bound so shapes repeat).")
    sliding_window: int | None = Field(
        None, ge=0, description="Sliding-window size of every drafter layer but the last (which sees the whole "
                                "context); 0 = all layers full attention; null = the target family's recipe "
                                "(2048 for Qwen3.5/3.6 targets, full attention otherwise).")
    drafter_heads: int | None = Field(None, ge=1, description="Attention heads of the drafter; null = the family "
                                                             "recipe (Qwen3.5/3.6: 32; otherwise the target's).")
    drafter_kv_heads: int | None = Field(None, ge=1, description="KV heads of the drafter; null = the family recipe "
                                                                "(Qwen3.5/3.6: 8; otherwise the target's).")
    drafter_head_dim: int | None = Field(None, ge=1, description="Head size of the drafter; null = the family "
                                                                "recipe (Qwen3.5/3.6: 128; otherwise the target's).")
    drafter_intermediate_size: int | None = Field(
        None, ge=1, description="MLP width of the drafter; null = the target's (3 x hidden for MoE targets).")
    drafter_rope_theta: float | None = Field(None, gt=0, description="RoPE base of the drafter; null = the target's.")
    mask_token_id: int | None = Field(
        None, ge=0, description="Token id of the drafter's masked slots; null = the tokenizer's mask token, else "
                                "<|MASK|>, else the family's (248070 for the Qwen3.5/3.6 tokenizer), else the first "
                                "id past the tokenizer (151669 for Qwen3).")
    kernels: Literal["auto", "torch", "liger"] = Field(
        "auto", description="The RMSNorm and SwiGLU kernels of the drafter and the frozen target (and the "
                            "target's rotary embedding): liger "
                            "(liger-kernel's fused Triton kernels; pip install 'dflashctl[fast]'), torch, or auto = "
                            "liger where it runs (a CUDA device with liger-kernel installed), torch elsewhere.")
    pack_target: bool | Literal["auto"] = Field(
        "auto", description="Run the target's feature pass on each batch packed into one row (no padding "
                            "computed; attention kept inside each sequence, and a Qwen3.5/3.6 hybrid's conv1d and "
                            "delta-rule state restarted per sequence). auto = where flash attention's varlen kernel "
                            "runs (a GPU), for a hybrid only with flash-linear-attention's kernels; true = also "
                            "elsewhere (the CPU: a dense document mask); false = never.")
    compile_target: bool | Literal["auto"] = Field("auto", description="torch.compile the frozen target's decoder "
        "layers (one graph for every layer, any token count, attention one operator in it; q/k/v and gate/up as one "
        "product each): Inductor fuses the norms, rotary embedding, residual adds and an fp8 target's activation "
        "quantization, in place of liger's kernels in the target. Compiled once at start-up. auto = for an fp8 "
        "target that is not a hybrid (measured at 8B on an H100: the target phase 1.32-1.33 x bf16's against 1.24 x "
        "eager); a bf16 target stays on liger's kernels (compiled: 1.000 x, the whole step 0.999 x); true = also "
        "in bf16; false = never. A hybrid target is refused.")
    target_precision: Literal["bf16", "fp8"] = Field("bf16", description="The frozen target's linear layers: bf16, "
        "or fp8 (E4M3 weights scaled per output channel, activations per token, torch._scaled_mm; the rest bf16); "
        "fp8 needs a GPU of compute capability 8.9 or above (Ada, Hopper).")
    num_workers: int = Field(2, ge=1, description="CPU threads that build batches (never GPU work).")
    prefetch: int = Field(8, ge=1, description="Batches built ahead of the training step.")
    device: str = Field("auto", description="auto (cuda:LOCAL_RANK if CUDA is available, else cpu), cpu or cuda.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Target weights and autocast dtype; auto = bfloat16 on GPU, float32 on CPU. "
                            "Drafter master weights are always float32.")
    save_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="dtype of each checkpoint's model.safetensors, the weights a server loads. The fp32 "
                                "master weights are kept next to the training state (master_weights.safetensors), "
                                "so a resumed run continues exactly.")
    resume: str = Field("auto", description="auto (newest complete checkpoint in output_dir), never, or a "
                                            "step_N directory.")
    shard_optimizer: bool | Literal["auto"] = Field(
        "auto", description="Shard AdamW's states across the ranks (ZeRO-1): each keeps them for 1/N of the "
                            "drafter's parameters, weights and gradients stay whole; the same updates as "
                            "unsharded. auto = on with more than one process.")
    simulate_shards: int = Field(
        0, ge=0, description="Memory check on one process: keep only the AdamW states rank 0 of N ranks would "
                             "keep (and update only those weights; the others stay as initialised), so the peak "
                             "memory can be measured against the N-GPU plan. Not a way to train; 0 = off.")
    replay_sequences: int = Field(
        2, ge=0, description="Sequences of each logged step's batch whose decoding rounds are replayed "
                             "teacher-forced (tau_replay, the acceptance histogram): one no-grad drafter pass "
                             "over their anchors, on logged steps only; 0 = off.")
    eval_every: int = Field(0, ge=0, description="Steps between evaluations on the held-out split that `prepare` "
                                                 "set aside (tau_heldout; rank 0); 0 = off.")
    eval_samples: int = Field(32, ge=1, description="Held-out samples whose rounds each evaluation replays.")
    eval_prompts: int = Field(0, ge=0, description="Held-out prompts each evaluation also decodes for real "
                                                   "(speculative decoding against the target: tau_eval); 0 = none.")
    eval_max_new_tokens: int = Field(64, ge=1, description="Tokens each real speculative decoding generates.")
    eval_tree_budgets: list[int] = Field(
        default_factory=lambda: list(DEFAULT_TREE_BUDGETS),
        description="Node budgets of the DDTree trees each evaluation replays on the held-out split as `trainer "
                    "eval --tree-budget` builds them (tau_tree_heldout, next to tau_heldout; no extra forward); "
                    "[] = none.")
    heldout_path: str | None = Field(None, description="Held-out dataset directory; null = {data_path}/heldout, "
                                                       "where `prepare` writes it.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, description="Experiment trackers that also get every step's numbers, the τ figures "
                                          "and the resolved config, under the run's name (rank 0): tensorboard "
                                          "({output_dir}/tensorboard), wandb (offline unless you configured it), "
                                          "mlflow (MLFLOW_TRACKING_URI, else {output_dir}/mlruns). Each needs "
                                          "its package: pip install 'dflashctl[report]' (tensorboard), wandb, "
                                          "mlflow.")

    @field_validator("loss", mode="before")
    @classmethod
    def _parse_loss(cls, value: Any) -> str | dict[str, float]:
        weights = parse_loss(value)
        # one objective at weight 1 stays a name, so the resolved config reads as it was written
        return next(iter(weights)) if len(weights) == 1 and next(iter(weights.values())) == 1.0 else weights

    def loss_weights(self) -> dict[str, float]:
        """{objective: weight}, from the `loss:` the validator already parsed (a name stands for weight 1)."""
        return {self.loss: 1.0} if isinstance(self.loss, str) else dict(self.loss)

    def needs_target_distribution(self) -> bool:
        return any(name in DISTRIBUTION_OBJECTIVES for name in self.loss_weights())

    @model_validator(mode="after")
    def _check_consistency(self, info: ValidationInfo) -> "TrainConfig":
        """Fill the derived defaults and check the keys against each other. With a `problems` list in the
        validation context, the problems go there (all of them, with the keys they need); else they raise."""
        if self.block_size is None:
            self.block_size = BLOCK_SIZE_DEFAULTS[self.architecture]
        if self.architecture == "dflash2":
            for key, default in DFLASH2_DEFAULTS.items():
                if getattr(self, key) is None:
                    setattr(self, key, default)
        if self.gamma is None:
            self.gamma = default_gamma(self.block_size)
        if self.anchor_budget is None:
            self.anchor_budget = max(1, self.token_budget // self.block_size)
        problems = self._consistency_problems()
        collected = (info.context or {}).get("problems")
        if collected is not None:
            collected.extend(problems)
        elif problems:
            raise ValueError("; ".join(p.message for p in problems))
        return self

    def _consistency_problems(self) -> list[Problem]:
        problems = self._architecture_problems()
        if self.target_layer_ids is not None and len(self.target_layer_ids) == 0:
            problems.append(Problem("target_layer_ids",
                                    "target_layer_ids must not be empty (leave it unset for the default)"))
        budgets = self.eval_tree_budgets
        if len(set(budgets)) != len(budgets) or any(not 1 <= budget <= MAX_TREE_BUDGET for budget in budgets):
            problems.append(Problem("eval_tree_budgets", f"eval_tree_budgets must be distinct node budgets from 1 "
                                                         f"to {MAX_TREE_BUDGET}, e.g. [8, 32, 64], got {budgets}"))
        bounds = self.buckets
        if len(bounds) < 2 or any(hi <= lo for lo, hi in zip(bounds, bounds[1:])) or bounds[0] < 0:
            problems.append(Problem("buckets", f"buckets must be at least two ascending boundaries >= 0, "
                                               f"got {bounds}"))
            return problems
        longest = bounds[-1] - 1
        if self.max_length is None:
            self.max_length = longest
        if self.max_length > longest:
            problems.append(Problem("max_length", f"max_length={self.max_length} does not fit the last bucket "
                                                  f"[.., {bounds[-1]})", needs=("buckets",)))
        if self.token_budget < longest:
            problems.append(Problem("token_budget", f"token_budget={self.token_budget} is smaller than the "
                                                    f"longest bucket ({longest} tokens): a batch of it could "
                                                    f"not hold one sample", needs=("buckets",)))
        return problems

    def _architecture_problems(self) -> list[Problem]:
        if self.architecture != "dflash2":
            return [Problem(key, f"{key} applies to architecture dflash2 only (architecture is {self.architecture})",
                            needs=("architecture",))
                    for key in DFLASH2_DEFAULTS if getattr(self, key) is not None]
        if self.conv_kernel_size not in CONV_KERNEL_SIZES:
            return [Problem("conv_kernel_size", f"conv_kernel_size={self.conv_kernel_size} is not supported: "
                                                f"dflash2's convolution has {CONV_KERNEL_SIZES[0]} taps")]
        return []


def suggest_key(key: str) -> str | None:
    """The config key `key` was probably meant to be: a known alias first, else the closest spelling."""
    normal = key.strip().lower().replace("-", "_")
    if normal in KEY_ALIASES:
        return KEY_ALIASES[normal]
    if normal in TrainConfig.model_fields:
        return normal
    close = difflib.get_close_matches(normal, TrainConfig.model_fields, n=1)
    return close[0] if close else None


def _field_problem(error: dict[str, Any]) -> Problem:
    key = str(error["loc"][0]) if error["loc"] else "config"
    location = ".".join(str(part) for part in error["loc"]) or "config"
    if error["type"] == "missing":
        return Problem(key, f"missing required key '{location}'")
    if error["type"] == "value_error":  # our own validators' messages, without pydantic's "Value error, "
        return Problem(key, f"{location}: {error['ctx']['error']}")
    return Problem(key, f"{location}: {error['msg']} (got {error.get('input')!r})")


@dataclass
class ConfigReport:
    """A config validated as far as it goes: every problem, and a config in which each key named in
    `unusable` holds its default (or a blank, for a required key) instead of the invalid value given."""

    config: TrainConfig
    problems: list[Problem]
    unusable: frozenset[str]


def validate_config(data: dict[str, Any]) -> ConfigReport:
    """Every problem of a config mapping in one pass: unknown keys, bad values, keys that contradict."""
    problems = []
    for key in data:
        if str(key) not in TrainConfig.model_fields:
            close = suggest_key(str(key))
            problems.append(Problem(str(key), f"unknown key '{key}'" + (f" (did you mean '{close}'?)"
                                                                        if close else "")))
    known = {key: value for key, value in data.items() if key in TrainConfig.model_fields}
    unusable: set[str] = set()
    consistency: list[Problem] = []
    try:
        config = TrainConfig.model_validate(known, context={"problems": consistency})
    except ValidationError as exc:
        # the keys checked against each other were not reached: check them again with the bad ones left out
        field_problems = [_field_problem(error) for error in exc.errors()]
        problems += field_problems
        unusable = {p.key for p in field_problems}
        usable = {key: value for key, value in known.items() if key not in unusable}
        blanks = {name: "" for name, info in TrainConfig.model_fields.items()
                  if info.is_required() and name not in usable}
        consistency.clear()
        config = TrainConfig.model_validate({**usable, **blanks}, context={"problems": consistency})
    problems += [p for p in consistency if not unusable & {p.key, *p.needs}]
    return ConfigReport(config, problems, frozenset(unusable))


def config_from_dict(data: Any, *, source: str) -> TrainConfig:
    if not isinstance(data, dict):
        raise TrainerError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    report = validate_config(data)
    if report.problems:
        raise ConfigError(source, report.problems)
    return report.config


def read_config_data(path: str | Path, *, text: str | bytes | None = None) -> dict[str, Any]:
    """The YAML mapping of a config file (or of `text`, read from it already); a TrainerError otherwise. The file
    must be UTF-8 (YAML's own encoding, and what every editor writes by default), at most 1 MiB, and its
    aliases may not expand past a bound (yamlbound.py)."""
    from .yamlbound import read_yaml

    path = Path(path)
    data = read_yaml(path, text, "the config") or {}
    if not isinstance(data, dict):
        raise TrainerError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def load_config(path: str | Path, *, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate a YAML config; any problem is a TrainerError naming the file and the key."""
    data = read_config_data(path)
    return config_from_dict({**data, **(overrides or {})}, source=str(path))


def resolved_config_text(config: TrainConfig) -> str:
    """The resolved config as YAML, printed at start and stored in every checkpoint."""
    import yaml

    return yaml.safe_dump(config.model_dump(), sort_keys=False, default_flow_style=None).rstrip("\n")
