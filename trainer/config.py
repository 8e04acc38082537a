"""The training config: one pydantic model, loaded from YAML, every field documented (torch-free).

Unknown keys are refused with the key's name and the closest known name, so a typo never silently falls back
to a default. Relative paths are taken relative to the working directory the trainer was started in.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainer.errors import TrainerError

# The seed run's length buckets (upper bounds exclusive): they spread a chat dataset's batches evenly enough.
SEED_BUCKETS = [0, 770, 1216, 1728, 2432, 3296, 8193]
# DFLASH.md: loss decay gamma per block size.
GAMMA_BY_BLOCK_SIZE = {16: 7.0, 10: 5.0, 8: 4.0}


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
    block_size: int = Field(16, ge=2, description="Slots per drafted block B (slot 0 = anchor token).")
    num_anchors: int = Field(512, ge=1, description="Most anchors (blocks) sampled per sequence per step.")
    anchor_budget: int | None = Field(
        None, ge=0, description="Most blocks per batch: a batch of n sequences samples min(num_anchors, "
                                "anchor_budget // n) per sequence. Default: token_budget // block_size, so the "
                                "drafter never runs more block tokens than the target ran tokens (its memory "
                                "grows with blocks x block_size); 0 = no cap.")
    gamma: float | None = Field(None, gt=0, description="Loss decay: slot k weighs exp(-(k-1)/gamma). "
                                                         "Default 7 for B=16, 5 for B=10, 4 for B=8.")
    drafter_layers: int = Field(5, ge=1, description="Decoder layers of the drafter; also the number of "
                                                     "tapped target layers when target_layer_ids is unset.")
    target_layer_ids: list[int] | None = Field(
        None, description="Target layers whose outputs feed the drafter. Default: drafter_layers taps spread "
                          "evenly from layer 1 to N-3 (N//2 for one tap).")
    token_budget: int = Field(49152, ge=1, description="Tokens per batch: a batch of bucket [lo, hi) holds "
                                                       "floor(token_budget / (hi - 1)) samples.")
    buckets: list[int] = Field(default_factory=lambda: list(SEED_BUCKETS),
                               description="Length bucket boundaries, ascending; the last one is exclusive.")
    max_length: int | None = Field(None, ge=2, description="Longest sample in tokens; default: the last "
                                                           "bucket boundary - 1.")
    overlong: Literal["truncate", "drop"] = Field("truncate", description="What to do with samples longer "
                                                                          "than max_length.")
    lr: float = Field(6e-4, gt=0, description="Peak learning rate (AdamW).")
    warmup_ratio: float = Field(0.04, ge=0, le=1, description="Share of steps with linear warmup; cosine "
                                                              "decay to 0 after.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0, description="Max global gradient norm; 0 disables clipping.")
    noise: float = Field(0.0, ge=0, description="Std of Gaussian noise added to target features (0 = off).")
    log_every: int = Field(10, ge=1, description="Steps between step lines (stdout + metrics.jsonl).")
    checkpoint_every: int = Field(1000, ge=0, description="Steps between checkpoints (0 = only at the end).")
    keep_checkpoints: int = Field(3, ge=0, description="Newest step_N/ checkpoints kept (0 = keep all).")
    seed: int = Field(0, description="Seed of weights init, data order, anchors and noise.")
    compile: bool = Field(False, description="torch.compile the drafter (batches are then padded to the "
                                             "bucket bound so shapes repeat).")
    sliding_window: int | None = Field(None, ge=1, description="Sliding-window size of the drafter's layers "
                                                               "(null = full attention).")
    num_workers: int = Field(2, ge=1, description="CPU threads that build batches (never GPU work).")
    prefetch: int = Field(8, ge=1, description="Batches built ahead of the training step.")
    device: str = Field("auto", description="auto (cuda:LOCAL_RANK if CUDA is available, else cpu), cpu or cuda.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Target weights and autocast dtype; auto = bfloat16 on GPU, float32 on CPU. "
                            "Drafter master weights are always float32.")
    resume: str = Field("auto", description="auto (newest complete checkpoint in output_dir), never, or a "
                                            "step_N directory.")

    @model_validator(mode="after")
    def _check_consistency(self) -> "TrainConfig":
        if self.gamma is None:
            self.gamma = default_gamma(self.block_size)
        if self.anchor_budget is None:
            self.anchor_budget = max(1, self.token_budget // self.block_size)
        bounds = self.buckets
        if len(bounds) < 2 or any(hi <= lo for lo, hi in zip(bounds, bounds[1:])) or bounds[0] < 0:
            raise ValueError(f"buckets must be at least two ascending boundaries >= 0, got {bounds}")
        if self.max_length is None:
            self.max_length = bounds[-1] - 1
        if self.max_length > bounds[-1] - 1:
            raise ValueError(f"max_length={self.max_length} does not fit the last bucket [.., {bounds[-1]})")
        longest = bounds[-1] - 1
        if self.token_budget < longest:
            raise ValueError(f"token_budget={self.token_budget} is smaller than the longest bucket "
                             f"({longest} tokens): a batch of it could not hold one sample")
        if self.target_layer_ids is not None and len(self.target_layer_ids) == 0:
            raise ValueError("target_layer_ids must not be empty (leave it unset for the default)")
        return self


def field_help() -> str:
    """Every config field with its type, default and description, for `train --help`."""
    lines = []
    for name, info in TrainConfig.model_fields.items():
        default = "required" if info.is_required() else f"default {info.get_default(call_default_factory=True)!r}"
        lines.append(f"  {name} ({default}): {info.description}")
    return "\n".join(lines)


def _describe_error(error: dict[str, Any]) -> str:
    location = ".".join(str(part) for part in error["loc"]) or "config"
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(error["loc"][0]), TrainConfig.model_fields, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"unknown key '{location}'{hint}"
    if error["type"] == "missing":
        return f"missing required key '{location}'"
    if location == "config" or error["type"] == "value_error":
        return error["msg"].removeprefix("Value error, ")
    return f"{location}: {error['msg']} (got {error.get('input')!r})"


def config_from_dict(data: Any, *, source: str) -> TrainConfig:
    if not isinstance(data, dict):
        raise TrainerError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    try:
        return TrainConfig(**data)
    except ValidationError as exc:
        problems = "; ".join(_describe_error(error) for error in exc.errors())
        raise TrainerError(f"{source}: {problems}") from None


def load_config(path: str | Path, *, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate a YAML config; any problem is a TrainerError naming the file and the key."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise TrainerError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise TrainerError(f"{path}: invalid YAML: {exc}") from None
    if isinstance(data, dict) and overrides:
        data = {**data, **overrides}
    return config_from_dict(data, source=str(path))


def resolved_config_text(config: TrainConfig) -> str:
    """The resolved config as YAML, printed at start and stored in every checkpoint."""
    import yaml

    return yaml.safe_dump(config.model_dump(), sort_keys=False, default_flow_style=None).rstrip("\n")
