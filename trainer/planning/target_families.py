"""The target families the trainer supports, known from a checkpoint's config.json alone (torch-free): the text
model inside a composite (image-text) checkpoint, the type of every layer, and each family's drafter recipe.

`check` and `train` both read a target through `read_target_spec`, so an unsupported model is refused with its
model_type, in one line, before any weight is loaded or any GPU memory is taken.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import TrainerError

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"

# text model_type -> family. Composite checkpoints name their own model_type and keep the text model's
# config under text_config; only the language model of those is ever loaded.
FAMILIES = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen3", "qwen3": "qwen3", "qwen3_moe": "qwen3",
    "qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5",
}
COMPOSITE = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
SUPPORTED_TEXT = ", ".join(sorted({*FAMILIES, *COMPOSITE}))

# The Qwen3.5/3.6 tokenizer's mask token, as the public DFlash drafters for that family use it.
QWEN3_5_VOCAB_SIZE = 248320
QWEN3_5_MASK_TOKEN_ID = 248070


@dataclass(frozen=True)
class TargetSpec:
    """What the trainer needs to know of a target before loading it."""

    model_type: str              # the text model's (qwen3_5_text for a composite qwen3_5 checkpoint)
    family: str                  # llama, qwen3 or qwen3_5
    composite: bool              # an image-text checkpoint whose language model alone is loaded
    text: dict                   # the text model's config keys
    layer_types: tuple[str, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def hidden_size(self) -> int:
        return int(self.text["hidden_size"])

    def count(self, layer_type: str, upto: int | None = None) -> int:
        """Layers of `layer_type` among the first `upto` (all by default)."""
        return sum(t == layer_type for t in self.layer_types[:upto])


def layer_types_of(text: dict) -> tuple[str, ...]:
    """Each layer's type: `layer_types` where the config has it, else rebuilt the way transformers does (a full
    attention layer every `full_attention_interval`, sliding layers from `max_window_layers` on), else all full."""
    num_layers = text.get("num_hidden_layers")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise TrainerError("config.json has no num_hidden_layers: not a causal LM config")
    given = text.get("layer_types")
    if isinstance(given, list) and len(given) == num_layers:
        return tuple(str(t) for t in given)
    interval = text.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))
    if text.get("use_sliding_window") and text.get("sliding_window"):
        first = int(text.get("max_window_layers") or 0)
        return tuple(SLIDING if i >= first else FULL for i in range(num_layers))
    return (FULL,) * num_layers


def target_spec(config: dict, *, source: str = "config.json") -> TargetSpec:
    """The spec of a config.json mapping; a TrainerError naming the model_type when it is not supported."""
    model_type = str(config.get("model_type") or "")
    composite = model_type in COMPOSITE
    text = config.get("text_config") if composite else config
    if composite and not isinstance(text, dict):
        raise TrainerError(f"{source}: a {model_type} checkpoint without a text_config")
    text_type = str(text.get("model_type") or COMPOSITE.get(model_type, model_type))
    if text_type not in FAMILIES:
        shown = model_type or "(none)"
        raise TrainerError(f"{source}: model_type {shown!r} is not a supported target; supported: {SUPPORTED_TEXT}")
    try:
        layer_types = layer_types_of(text)
    except TrainerError as exc:
        raise TrainerError(f"{source}: {exc}") from None
    unknown = sorted(set(layer_types) - {FULL, SLIDING, LINEAR})
    if unknown:
        raise TrainerError(f"{source}: layer type(s) {', '.join(unknown)} are not supported")
    return TargetSpec(model_type=text_type, family=FAMILIES[text_type], composite=composite, text=dict(text),
                      layer_types=layer_types)


def read_target_spec(path: str | Path) -> TargetSpec:
    """The spec of the model directory `path` (its config.json read as JSON)."""
    config_json = Path(path) / "config.json"
    if not config_json.is_file():
        raise TrainerError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        data = json.loads(config_json.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TrainerError(f"{config_json} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TrainerError(f"{config_json} is not a JSON object")
    return target_spec(data, source=str(config_json))


@dataclass(frozen=True)
class DrafterShape:
    """The drafter's own sizes where they may differ from the target's."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    sliding_window: int | None   # the window of every layer but the last; None: all full attention
    rope_theta: float


def _rope_theta(text: dict) -> float:
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return float(rope.get("rope_theta") or text.get("rope_theta") or 10000.0)


def recipe_shape(spec: TargetSpec) -> DrafterShape:
    """The family's drafter recipe.

    - qwen3 / llama: the target's own attention shape, all layers full attention (the public Qwen3 drafters).
    - qwen3_5 (Qwen3.5/3.6 hybrids): Qwen3 layers of 32 heads, 8 KV heads, head_dim 128, the target's
      intermediate size (3 x hidden for MoE targets, which have none), sliding window 2048 on every layer but
      the last, the target's rope theta; the public Qwen3.6-27B recipe. A target narrower than 1024 (the tiny
      test targets) keeps its own full-attention shape instead, so the drafter stays as small as the target.
    """
    text = spec.text
    hidden = spec.hidden_size
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    intermediate = int(text.get("intermediate_size") or 3 * hidden)
    own = DrafterShape(num_heads=heads, num_kv_heads=int(text.get("num_key_value_heads") or heads),
                       head_dim=head_dim, intermediate_size=intermediate, sliding_window=None,
                       rope_theta=_rope_theta(text))
    if spec.family != "qwen3_5":
        return own
    if hidden < 1024:
        return DrafterShape(**{**own.__dict__, "sliding_window": 2048})
    return DrafterShape(num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=intermediate,
                        sliding_window=2048, rope_theta=_rope_theta(text))


def family_mask_token_id(spec: TargetSpec) -> int | None:
    """The mask token the family's public drafters use, where the tokenizer names none (Qwen3.5/3.6: 248070)."""
    if spec.family == "qwen3_5" and int(spec.text.get("vocab_size") or 0) == QWEN3_5_VOCAB_SIZE:
        return QWEN3_5_MASK_TOKEN_ID
    return None


def drafter_shape(spec: TargetSpec, *, heads: int | None = None, kv_heads: int | None = None,
                  head_dim: int | None = None, intermediate_size: int | None = None,
                  sliding_window: int | None = None, rope_theta: float | None = None) -> DrafterShape:
    """The recipe with the config's explicit values over it (None keeps the recipe's; sliding_window 0 = none)."""
    recipe = recipe_shape(spec)
    given = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
             "intermediate_size": intermediate_size, "rope_theta": rope_theta}
    values = {**recipe.__dict__, **{key: value for key, value in given.items() if value is not None}}
    if sliding_window is not None:
        values["sliding_window"] = sliding_window or None
    shape = DrafterShape(**values)
    if shape.num_heads % shape.num_kv_heads:
        raise TrainerError(f"drafter_heads={shape.num_heads} is not a multiple of drafter_kv_heads="
                           f"{shape.num_kv_heads}")
    return shape
