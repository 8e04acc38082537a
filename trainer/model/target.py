"""The frozen target LLM: tapped hidden states for the drafter, and full logits for speculative decoding.

Dense and MoE Qwen3, Llama-family and Qwen3.5/3.6 hybrid targets (Gated DeltaNet linear-attention layers between
full-attention ones), text-only or the language model of a composite image-text checkpoint
(trainer/planning/target_families.py).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
from pathlib import Path

import torch
from torch import nn

from trainer.errors import TrainerError
from trainer.model import packing as packing_lib
from trainer.model.kernels import importable
from trainer.planning.taps import default_target_layer_ids, validate_layer_ids
from trainer.planning.target_families import (FULL, LINEAR, SLIDING, TargetSpec, family_mask_token_id, read_target_spec,
                                          target_spec)

MASK_TOKEN = "<|MASK|>"
LAYER_NAMES = {LINEAR: "linear-attention", FULL: "full-attention", SLIDING: "sliding-window"}


def resolve_mask_token_id(tokenizer, vocab_size: int, *, family_default: int | None = None) -> int:
    """The tokenizer's mask token, else `<|MASK|>`, else the family's (target_families.family_mask_token_id: 248070 for
    the Qwen3.5/3.6 tokenizer), else the first id past the tokenizer (Qwen3: 151669)."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    vocab = tokenizer.get_vocab()
    if MASK_TOKEN in vocab:
        return int(vocab[MASK_TOKEN])
    if family_default is not None and family_default < vocab_size:
        return family_default
    # the embedding matrix is usually padded past the tokenizer; the drafter only embeds the id, never decodes it
    mask_id = len(tokenizer)
    if mask_id >= vocab_size:
        raise TrainerError(
            f"the tokenizer has no mask token and no spare embedding row for one (vocab {vocab_size})")
    return mask_id


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """True when no row of a [B, S] mask has a real token after a padded one."""
    mask = attention_mask.bool()
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def check_target_dir(path: Path) -> TargetSpec:
    """The target's spec from its config.json; a TrainerError (nothing loaded yet) for a missing directory or an
    unsupported model."""
    if not path.is_dir():
        raise TrainerError(f"target directory {path} does not exist")
    return read_target_spec(path)


def linear_attention_kernel(spec: TargetSpec) -> str | None:
    """Which gated-delta-rule kernel transformers bound for the target's linear-attention layers (None: it has
    none): "fla" (flash-linear-attention was importable) or "torch" (its slow reference path). Read off the
    modeling module without loading any weight."""
    if LINEAR not in spec.layer_types:
        return None
    name = spec.model_type.removesuffix("_text")
    try:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        function = module.torch_chunk_gated_delta_rule
        picked = inspect.getclosurevars(function).nonlocals.get("is_new_implementation")
    except (ImportError, AttributeError, TypeError, ValueError):
        picked = None
    if picked is not None:
        return "fla" if picked else "torch"
    return "fla" if importable("fla") else "torch"  # releases that choose without a wrapper: the same test


def refuse_fla_off_gpu(spec: TargetSpec, device: torch.device) -> None:
    """transformers binds its linear-attention kernel once per process: with flash-linear-attention installed
    every hybrid model runs its Triton kernels, which need CUDA tensors. Say so before loading, rather than
    fail in the middle of a forward."""
    if device.type != "cuda" and linear_attention_kernel(spec) == "fla":
        raise TrainerError(f"a hybrid target cannot run on {device.type} with flash-linear-attention installed "
                           f"(its kernels are CUDA-only and transformers uses them on every device): use a GPU, "
                           f"or an environment without the fla extra")


def refuse_fp8(device: torch.device) -> None:
    """fp8 on the CPU or on a GPU without FP8 matrix cores: one line, before any weight is read."""
    from trainer.planning.precision import fp8_refusal

    gpu = None
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))
    refusal = fp8_refusal(gpu)
    if refusal is not None:
        raise TrainerError(refusal)


def run_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None, position_ids: torch.Tensor,
              position_embeddings, attention: dict) -> torch.Tensor:
    """One decoder layer of the feature pass; `attention`: keywords for the attention function (a packed pass's
    sequences, packing.attention_kwargs)."""
    hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings,
                   **attention)
    return hidden[0] if isinstance(hidden, tuple) else hidden   # older transformers return (hidden,)


class TargetModel:
    """A frozen HF causal LM. `features` runs only the embedding and the layers up to the last tap."""

    def __init__(self, hf_model: nn.Module, *, layer_ids: list[int], mask_token_id: int, tokenizer=None,
                 packing: bool | str = "auto"):
        implementation = getattr(hf_model.config, "_attn_implementation", "sdpa")
        if implementation != "sdpa":
            # features() hands the layers boolean masks, which only the SDPA implementation reads as such
            raise ValueError(f"the target must use attn_implementation='sdpa', not {implementation!r}")
        self.hf_model = hf_model.eval().requires_grad_(False)
        self.config = hf_model.config
        self.spec = target_spec(hf_model.config.to_dict())
        self.layer_ids = list(layer_ids)
        self.mask_token_id = mask_token_id
        self.tokenizer = tokenizer
        self.decoder = hf_model.base_model
        self.embed_tokens: nn.Embedding = self.decoder.embed_tokens
        self.lm_head: nn.Linear = hf_model.get_output_embeddings()
        self.packing = packing   # "auto": pack where flash attention's varlen kernel runs; True/False: always/never
        self.precision = "bf16"  # or what to_fp8 says of the linear layers it swapped
        self.run_layer = run_layer   # or its torch.compile'd self (compile_layers)

    @classmethod
    def load(cls, path: str | Path, *, layer_ids: list[int] | None, num_taps: int,
             device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
             mask_token_id: int | None = None, packing: bool | str = "auto",
             precision: str = "bf16") -> "TargetModel":
        """Load a local HF model directory (of a composite checkpoint, its language model only: transformers maps
        a qwen3_5 image-text checkpoint to Qwen3_5ForCausalLM and skips the vision tower's weights); dtype
        defaults to bf16 on GPU and fp32 on CPU; precision "fp8" puts the decoder's linear layers in FP8 (to_fp8).
        The model, the taps and the precision are checked before any weight is read."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        spec = check_target_dir(path)
        if layer_ids is None:
            layer_ids = default_target_layer_ids(spec.num_layers, num_taps)
        layer_ids = validate_layer_ids(layer_ids, spec.num_layers)
        device = torch.device(device)
        refuse_fla_off_gpu(spec, device)
        if precision == "fp8":
            refuse_fp8(device)
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        tokenizer = AutoTokenizer.from_pretrained(path)
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        rows = hf_model.get_input_embeddings().num_embeddings
        if mask_token_id is None:
            mask_token_id = resolve_mask_token_id(tokenizer, rows, family_default=family_mask_token_id(spec))
        elif not 0 <= mask_token_id < rows:
            raise TrainerError(f"mask_token_id={mask_token_id} is outside the target's embedding (0..{rows - 1})")
        target = cls(hf_model.to(device), layer_ids=layer_ids, mask_token_id=mask_token_id, tokenizer=tokenizer,
                     packing=packing)
        if precision == "fp8":
            target.to_fp8()
        return target

    def to_fp8(self, *, emulate: bool = False) -> None:
        """The decoder layers' linear layers in FP8, in place (trainer/model/fp8.py; `emulate`: multiplied in fp32,
        on any device); the embedding, the norms, attention and the LM head stay as they are."""
        from trainer.model import fp8

        if not emulate:
            fp8.probe(self.device)
        swapped, left = fp8.quantize_linears(self.decoder.layers, emulate=emulate)
        self.precision = f"fp8 linear layers ({swapped}" + (f"; {left} left in {self.config.dtype}" if left else "") \
            + ")"

    def compile_layers(self, on: bool = True) -> None:
        """Run each decoder layer through one torch.compile'd function (dynamic token counts; the layers share its
        graph, their weights being its inputs), so the elementwise work between the products is fused by Inductor:
        the residual adds into the next norm, the q/k norms into the rotary embedding, an FP8 target's activation
        quantization into the norm or SwiGLU that makes the activations. Sibling projections (q, k, v; gate, up)
        run as one product each (trainer/model/siblings.py). A packed pass's attention is one opaque operator in
        the graph (packing.packed_attention_op), so each layer is one graph for any batch. On, the target's modules get
        their own torch forwards back (liger's Triton kernels would be opaque to the compiler, and read the
        merged products' slices wrongly); off splits the projections again and leaves the kernels as they are."""
        from trainer.model import siblings

        if on:
            from trainer.model import kernels

            kernels.install_target(self.hf_model, "torch")
            siblings.merge_siblings(self.decoder.layers)
        else:
            siblings.split_siblings(self.decoder.layers)
        self.run_layer = torch.compile(run_layer, dynamic=True) if on else run_layer

    def kernels(self) -> dict[str, str]:
        """The kernel each layer type runs on."""
        attention = getattr(self.config, "_attn_implementation", "sdpa")
        return {FULL: attention, SLIDING: attention, LINEAR: linear_attention_kernel(self.spec)}

    def describe(self) -> str:
        """One start-up line: family, size, each layer type with its kernel, taps, e.g. `Target: qwen3_5 26.9B,
        48 linear-attention layers (fla), 16 full-attention (sdpa), taps [1, 16, 31, 46, 61]`."""
        params = sum(p.numel() for p in self.hf_model.parameters()) + sum(
            m.weight.numel() for m in self.hf_model.modules() if type(m).__name__ == "Fp8Linear")
        size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
        kernels = self.kernels()
        kinds = [kind for kind in (LINEAR, FULL, SLIDING) if self.spec.count(kind)]
        parts = [f"{self.spec.count(kind)} {LAYER_NAMES[kind]}" + (" layers" if i == 0 else "") + f" ({kernels[kind]})"
                 for i, kind in enumerate(kinds)]
        model_type = self.spec.model_type.removesuffix("_text")
        precision = "" if self.precision == "bf16" else f", {self.precision}"
        return f"Target: {model_type} {size}, {', '.join(parts)}, taps {self.layer_ids}{precision}"

    def compiles_layers(self, setting: bool | str) -> bool:
        """compile_target resolved for this target: "auto" compiles the layers of an FP8 target that is not a hybrid
        (the FP8 phase ran 1.32-1.33 x bf16's compiled against 1.24 x eager, H100, 8B); a bf16 one stays on liger's
        kernels, where compiling gained nothing measurable."""
        if setting == "auto":
            return self.precision.startswith("fp8") and LINEAR not in self._layer_types()
        return bool(setting)

    def can_pack(self) -> bool:
        """Whether this target's feature pass runs packed here: with "auto" where the varlen flash kernel runs (a
        hybrid's linear-attention layers then keep the sequences apart too: packed_linear_attention), for a hybrid
        only with flash-linear-attention's kernels, which take the sequences' bounds (transformers' torch path would
        run the delta rule one sequence at a time, unbatched)."""
        if self.packing is False:
            return False
        if self.packing == "auto" and LINEAR in self._layer_types() and linear_attention_kernel(self.spec) != "fla":
            return False
        on_gpu = packing_lib.varlen_available(self.device)
        windowed = SLIDING in self._layer_types() and getattr(self.config, "sliding_window", None)
        if on_gpu and windowed and not packing_lib.supports_window():
            return False
        return on_gpu or self.packing is True

    def packing_line(self) -> str:
        if not self.can_pack():
            return "target batches padded"
        kernel = "varlen flash attention" if packing_lib.varlen_available(self.device) else "SDPA, document mask"
        return f"target batches packed ({kernel})"

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def _layer_masks(self, seq_len: int, attention_mask: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
        """Boolean [B|1, 1, S, S] masks (True = attend) for SDPA, one per layer type; None where causality alone
        is the mask, which lets SDPA run its causal flash kernel instead of a masked one.

        Built here rather than with transformers' mask helpers, whose signatures change between releases."""
        window = getattr(self.config, "sliding_window", None)
        sliding = SLIDING in self._layer_types() and window
        # linear-attention layers take the [B, S] padding mask itself (they zero the padded states)
        masks: dict[str, torch.Tensor | None] = {FULL: None, LINEAR: attention_mask}
        if attention_mask is None and not sliding:
            return masks
        positions = torch.arange(seq_len, device=self.device)
        causal = positions[None, :] <= positions[:, None]
        keep = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        if keep is not None:
            masks[FULL] = causal[None, None] & keep
        if sliding:
            local = (causal & (positions[:, None] - positions[None, :] < window))[None, None]
            masks[SLIDING] = local if keep is None else local & keep
        return masks

    def _layer_types(self) -> tuple[str, ...]:
        return self.spec.layer_types

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 final: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """[B, S, k*H]: the tapped layers' outputs (layer i's output is HF's hidden_states[i + 1]), concatenated.
        With `final`, also [B, S, H]: the last layer's output after the final norm (what the LM head reads), for
        objectives against the target's distribution; the layers past the last tap then run too, in the same
        pass and with the same kernels and packing.

        attention_mask [B, S] is 1 on real tokens. A right-padded mask on the CPU (every row's ones come first,
        as the trainer's batches are) is dropped: under causal attention no real token sees a pad, so the
        layers run the unmasked causal kernel. Outputs at padded positions are then not meaningful."""
        input_ids = input_ids.to(self.device)
        if attention_mask is not None and attention_mask.device.type == "cpu" and is_right_padded(attention_mask):
            if len(input_ids) > 1 and not bool(attention_mask.all()) and self.can_pack():
                return self.packed_features(input_ids, packing_lib.plan(attention_mask, self.device), final=final)
            attention_mask = None
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
        position_ids = torch.arange(input_ids.shape[1], device=self.device).unsqueeze(0)
        masks = self._layer_masks(input_ids.shape[1], attention_mask)
        return self._tapped(input_ids, position_ids, masks, final=final)

    @torch.no_grad()
    def packed_features(self, input_ids: torch.Tensor, plan: packing_lib.PackPlan, *,
                        final: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """features() of a right-padded batch computed on its real tokens alone, packed into one row (the plan's);
        padded positions of the result are zero."""
        masks = {kind: None for kind in (FULL, SLIDING, LINEAR)}
        linear = contextlib.nullcontext()
        if LINEAR in self._layer_types():
            linear = packing_lib.packed_linear_attention(self.spec.model_type, plan,
                                                         kernel=linear_attention_kernel(self.spec))
        with packing_lib.packed_attention(self.config), linear:
            packed = self._tapped(packing_lib.pack(input_ids, plan), plan.position_ids, masks, final=final,
                                  **packing_lib.attention_kwargs(plan))
        if final:
            return packing_lib.unpack(packed[0], plan), packing_lib.unpack(packed[1], plan)
        return packing_lib.unpack(packed, plan)

    def _tapped(self, input_ids: torch.Tensor, position_ids: torch.Tensor, masks: dict, *, final: bool = False,
                **attention) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The embedding and the layers up to the last tap (with `final`: every layer and the final norm); the
        tapped outputs concatenated."""
        hidden = self.embed_tokens(input_ids)
        # Qwen3.5's rotary embedding is multimodal (one row of positions per time/height/width axis); text uses
        # the same positions on all three, which some releases broadcast themselves and others require given
        rope_positions = position_ids
        if hasattr(self.decoder.rotary_emb, "mrope_section"):
            rope_positions = position_ids[None].expand(3, -1, -1)
        position_embeddings = self.decoder.rotary_emb(hidden, rope_positions)
        layer_types = self._layer_types()
        tapped, wanted = [], set(self.layer_ids)
        # layers past the last tap run only for the target's own distribution: otherwise they would be thrown away
        for i in range(self.num_layers if final else self.layer_ids[-1] + 1):
            hidden = self.run_layer(self.decoder.layers[i], hidden, masks[layer_types[i]], position_ids,
                                    position_embeddings, attention)
            if i in wanted:
                tapped.append(hidden)
        if final:
            return torch.cat(tapped, dim=-1), self.decoder.norm(hidden)
        return torch.cat(tapped, dim=-1)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, S, V]: a full forward pass (for generation and verification)."""
        input_ids = input_ids.to(self.device)
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
        return self.hf_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
