"""The drafter on disk, in the layout SGLang and vLLM load: config.json + model.safetensors, no embedding/LM head.

Training state (optimizer, scheduler, RNG, data position) is not written here; see train.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from trainer.drafter import DFlashDrafter, DrafterConfig, unwrap
from trainer.errors import TrainerError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def drafter_tensors(drafter: nn.Module, *, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """name -> full CPU tensor. Under FSDP2 every rank must call this (DTensor.full_tensor gathers)."""
    tensors = {}
    for name, value in unwrap(drafter).state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        tensors[name] = value.cpu().contiguous()
    return tensors


def save_drafter(drafter: nn.Module, out_dir: Path, *, dtype: torch.dtype | None = None) -> None:
    """Write config.json and model.safetensors into out_dir (the caller makes the directory appear atomically).

    dtype: cast floating tensors on the way out (e.g. bf16 for serving); default keeps the training dtype."""
    from safetensors.torch import save_file

    model = unwrap(drafter)
    tensors = drafter_tensors(model, dtype=dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf_dict()
    saved_dtype = next(iter(tensors.values())).dtype
    # transformers 5 reads "dtype", older releases and serving engines "torch_dtype"
    config["torch_dtype"] = config["dtype"] = _DTYPE_NAMES.get(saved_dtype, str(saved_dtype).removeprefix("torch."))
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})


def read_drafter_config(ckpt_dir: Path) -> DrafterConfig:
    path = Path(ckpt_dir) / CONFIG_FILE
    if not path.is_file():
        raise TrainerError(f"{ckpt_dir} is not a drafter checkpoint (no {CONFIG_FILE})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TrainerError(f"{path}: not valid JSON ({exc})") from exc
    if data.get("architectures") != ["DFlashDraftModel"] or "dflash_config" not in data:
        raise TrainerError(f"{path}: not a DFlash drafter config (architectures {data.get('architectures')})")
    try:
        return DrafterConfig.from_hf_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainerError(f"{path}: incomplete DFlash drafter config ({exc})") from exc


def _check_shared_modules(config: DrafterConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> None:
    expected = (config.vocab_size, config.hidden_size)
    for name, module in (("embedding", embed_tokens), ("LM head", lm_head)):
        if tuple(module.weight.shape) != expected:
            raise TrainerError(f"the target's {name} is {tuple(module.weight.shape)}, the drafter expects "
                               f"{expected}: this drafter was trained for another target")


def load_drafter(ckpt_dir: Path, *, embed_tokens: nn.Embedding, lm_head: nn.Linear,
                 device: torch.device | str | None = None) -> DFlashDrafter:
    """A drafter built from a checkpoint, sharing the given (target's) embedding and LM head."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    config = read_drafter_config(ckpt_dir)
    _check_shared_modules(config, embed_tokens, lm_head)
    weights_path = ckpt_dir / WEIGHTS_FILE
    if not weights_path.is_file():
        raise TrainerError(f"{ckpt_dir} has no {WEIGHTS_FILE}")
    tensors = load_file(str(weights_path))
    drafter = DFlashDrafter(config, embed_tokens=embed_tokens, lm_head=lm_head)
    dtype = next(iter(tensors.values())).dtype
    drafter.to(dtype=dtype)
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise TrainerError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    return drafter.to(device) if device is not None else drafter
