"""DFlash2's sizes and the choices we made where the public contract is silent (torch-free).

The published DFlash2 checkpoints fix the architecture names, the nested `dflash_config` keys and the tensor
names (`layers.{i}.attention_conv` / `mlp_conv` with `base_kernel` [2, taps, H] and `kernel_projection`
[2 * taps * H / group, H]; `candidate_selector.hidden_projection` [rank, H], `predecessor_codebook` and
`successor_codebook` [V, rank]). What the selector is trained on is not published: OUR_CHOICES says what this
trainer does instead, in this one place (bench/RESULTS.md, "DFlash2", repeats it).
"""
from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURE_NAMES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}

# The selector's training objective (trainer/training/selector_objective.py reads these):
# - it is trained with a K-way cross-entropy over the unary top-K candidates of each drafted slot, the previous
#   token teacher-forced (the anchor at slot 1, else the text's token before the slot);
# - a label outside the top K replaces the weakest candidate, so every supervised slot has a target;
# - the unary logits and the slot's hidden state enter the scores detached: the selector loss trains the selector
#   alone, the backbone keeps DFlash's objective;
# - slots are weighted by the decay weights (supervised only), whatever the main loss's slot_weights, and the
#   term is added with this weight.
SELECTOR_LOSS_WEIGHT = 1.0
# The path through the candidates: the highest summed pair score over the whole block (Viterbi). The public
# reference walks greedily instead (each slot the best candidate after the one chosen before it).
OUR_CHOICES = ("selector: K-way CE over the unary top-K, previous token teacher-forced, label swapped in for the "
               "weakest candidate, unary and hidden detached, weight 1.0; path: Viterbi over the block; codebooks "
               "free [V, rank] parameters; convolution initialised to the identity, selector codebooks N(0, 0.02)")


@dataclass(frozen=True)
class Dflash2Sizes:
    """The convolution and selector sizes of a DFlash2 drafter (config.json's `dflash_config` holds them)."""

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int

    @classmethod
    def from_mapping(cls, data) -> "Dflash2Sizes":
        """From a training config (attributes) or a checkpoint's `dflash_config` (keys)."""
        get = data.get if isinstance(data, dict) else lambda key: getattr(data, key)
        return cls(**{key: int(get(key)) for key in cls.__dataclass_fields__})

    def problems(self, *, hidden_size: int, vocab_size: int) -> list[tuple[str, str]]:
        """What makes these sizes unusable for a drafter of this hidden size and vocabulary: (key, one line)."""
        found = []
        if hidden_size % self.conv_group_size:
            found.append(("conv_group_size", f"conv_group_size={self.conv_group_size} does not divide the hidden "
                                             f"size {hidden_size}"))
        if not 1 <= self.selector_top_k <= vocab_size:
            found.append(("selector_top_k", f"selector_top_k={self.selector_top_k} must be between 1 and the "
                                            f"vocabulary size {vocab_size}"))
        return found

    def layer_param_numels(self, hidden_size: int) -> list[int]:
        """Per drafter layer: attention_conv's base_kernel and kernel_projection, then mlp_conv's."""
        conv = [2 * self.conv_kernel_size * hidden_size,
                2 * self.conv_kernel_size * (hidden_size // self.conv_group_size) * hidden_size]
        return conv * 2

    def selector_param_numels(self, hidden_size: int, vocab_size: int) -> list[int]:
        """predecessor_codebook, successor_codebook, hidden_projection (the module's parameters() order)."""
        return [vocab_size * self.selector_rank, vocab_size * self.selector_rank, self.selector_rank * hidden_size]

    def saved_bytes_per_query(self, hidden_size: int, act: int) -> int:
        """An estimate (not measured like DFlash's figures) of what one layer's four convolution sides keep per
        block token: the kernel projection's input and, per side and tap, the shifted input of the product."""
        return act * hidden_size * (2 + 4 * self.conv_kernel_size)

    def saved_bytes_per_slot(self, act: int) -> int:
        """An estimate of what the selector's objective keeps per drafted slot: the successor rows of its K
        candidates, the predecessor row and the gate, and the K scores."""
        return act * (self.selector_top_k * self.selector_rank + 2 * self.selector_rank) + 8 * self.selector_top_k
