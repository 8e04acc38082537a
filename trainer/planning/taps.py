"""Which target layers feed the drafter: the default spread and the checks of explicit ids (torch-free)."""
from __future__ import annotations

from trainer.errors import TrainerError


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Taps spread evenly from layer 1 to layer N-3 (rounded); a single tap sits at layer N//2."""
    if num_taps < 1:
        raise TrainerError(f"the number of tapped target layers must be at least 1, got {num_taps}")
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end - start + 1 < num_taps:
        raise TrainerError(
            f"a {num_target_layers}-layer target has too few layers for {num_taps} taps between 1 and N-3")
    span = end - start
    return [int(round(start + i * span / (num_taps - 1))) for i in range(num_taps)]


def validate_layer_ids(layer_ids: list[int], num_target_layers: int) -> list[int]:
    """Checks explicit tap ids against the target's depth; they must be distinct and ascending."""
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise TrainerError("target_layer_ids is empty")
    bad = [i for i in ids if not 0 <= i < num_target_layers]
    if bad:
        raise TrainerError(
            f"target_layer_ids {bad} out of range: the target has {num_target_layers} layers (0..{num_target_layers - 1})")
    if ids != sorted(set(ids)):
        raise TrainerError(f"target_layer_ids must be distinct and ascending, got {ids}")
    return ids
