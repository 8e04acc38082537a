"""What a config's `loss:` may say: the training objectives by name, their defaults, a `loss:` value parsed into
weights, and the one line that describes an objective in logs and model cards (torch-free: the config and the
controller's check read it; trainer/training/losses.py computes the objectives).
"""
from __future__ import annotations

import difflib
from typing import Any

# The training objectives (trainer/training/losses.py computes them): ce and cap need only the data's labels, the
# others the target's own distribution at each labelled position (its last layers and LM head run for them).
LABEL_OBJECTIVES = ("ce", "cap")
DISTRIBUTION_OBJECTIVES = ("kl", "tv", "nla", "lk_hybrid")
OBJECTIVES = LABEL_OBJECTIVES + DISTRIBUTION_OBJECTIVES


def parse_loss(value: Any) -> dict[str, float]:
    """The `loss:` value as {objective: weight}: a name (weight 1) or a mapping of names to weights >= 0, at
    least one of them positive. A ValueError of one line otherwise."""
    known = ", ".join(OBJECTIVES)
    if isinstance(value, str):
        value = {value: 1.0}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"loss must be an objective name ({known}) or a mapping of them to weights, "
                         f"e.g. {{ce: 0.1, cap: 0.9}}")
    weights = {}
    for name, weight in value.items():
        if name not in OBJECTIVES:
            close = difflib.get_close_matches(str(name), OBJECTIVES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"unknown objective '{name}'{hint}; known: {known}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise ValueError(f"the weight of '{name}' must be a number >= 0, got {weight!r}")
        weights[name] = float(weight)
    if not any(weights.values()):
        raise ValueError("loss: at least one objective needs a weight > 0")
    return weights


# The objective's defaults: TrainConfig's fields, and the loss code's Objective when built without a config.
DEFAULT_LOSS = "ce"
DEFAULT_SLOT_WEIGHTS = "dpace"
DEFAULT_DPACE_ALPHA = 0.5


def objective_text(weights: dict[str, float], slot_weights: str) -> str:
    """One line for logs and model cards from parsed weights (parse_loss), e.g. `0.1*ce + 0.9*cap, decay slot
    weights`."""
    terms = " + ".join(name if weight == 1.0 else f"{weight:g}*{name}" for name, weight in weights.items())
    return f"{terms}, {slot_weights} slot weights"
