"""The drafter on disk, in the layout SGLang and vLLM load: config.json + model.safetensors, no embedding/LM head,
plus `dflash.py` (trainer/model/modeling_dflash.py, named by config.json's auto_map) so that transformers loads it too.

What eval, export and training share: a training checkpoint (trainer/training/checkpoints.py) is this plus its
training state. Every file is readable as the umask allows (644 by default), so a server run by another user can
load it.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from trainer.errors import TrainerError
from trainer.model.drafter import DFlashDrafter, DrafterConfig, unwrap
from trainer.planning.dflash2 import ARCHITECTURE_NAMES

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODELING_FILE = "dflash.py"   # the public DFlash checkpoints' name: auto_map "dflash.DFlashDraftModel"
MASTER_WEIGHTS_FILE = "master_weights.safetensors"  # fp32, written when model.safetensors is not
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_NAMES = {value: key for key, value in DTYPES.items()}


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


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask alone must set it to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_readable(path: Path) -> None:
    """The mode an ordinary new file gets (0o666 minus the umask): safetensors writes its files 0o600."""
    os.chmod(path, 0o666 & ~current_umask())


def serving_config(config: DrafterConfig, dtype: torch.dtype) -> dict:
    """config.json: DFLASH.md's keys, the dtype of the weights and the auto_map that names the modeling file."""
    data = config.to_hf_dict()
    # transformers 5 reads "dtype", older releases and serving engines "torch_dtype"
    data["torch_dtype"] = data["dtype"] = _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    data["auto_map"] = {"AutoModel": f"{Path(MODELING_FILE).stem}.{data['architectures'][0]}"}
    return data


def write_modeling_file(out_dir: Path) -> Path:
    """trainer/model/modeling_dflash.py, verbatim, as the checkpoint's dflash.py."""
    from trainer.model import modeling_dflash

    path = Path(out_dir) / MODELING_FILE
    shutil.copyfile(modeling_dflash.__file__, path)
    make_readable(path)
    return path


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    make_readable(path)


def save_drafter(drafter: nn.Module, out_dir: Path, *, dtype: torch.dtype | None = None) -> None:
    """Write config.json, model.safetensors and dflash.py into out_dir (the caller makes the directory appear
    atomically).

    dtype: cast floating tensors on the way out (e.g. bf16 for serving); default keeps the training dtype."""
    model = unwrap(drafter)
    tensors = drafter_tensors(model, dtype=dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = serving_config(model.config, next(iter(tensors.values())).dtype)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    make_readable(out_dir / CONFIG_FILE)
    save_weights(tensors, out_dir / WEIGHTS_FILE)
    write_modeling_file(out_dir)


def read_drafter_config(ckpt_dir: Path) -> DrafterConfig:
    path = Path(ckpt_dir) / CONFIG_FILE
    if not path.is_file():
        raise TrainerError(f"{ckpt_dir} is not a drafter checkpoint (no {CONFIG_FILE})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TrainerError(f"{path}: not valid JSON ({exc})") from exc
    known = [[name] for name in ARCHITECTURE_NAMES.values()]
    if data.get("architectures") not in known or "dflash_config" not in data:
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
                 device: torch.device | str | None = None, serving: bool = False) -> DFlashDrafter:
    """A drafter built from a checkpoint, sharing the given (target's) embedding and LM head.

    It holds the fp32 master weights where the checkpoint has them (a training checkpoint whose
    model.safetensors is bf16), else model.safetensors; `serving` loads model.safetensors, what a server runs."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    config = read_drafter_config(ckpt_dir)
    _check_shared_modules(config, embed_tokens, lm_head)
    weights_path = ckpt_dir / WEIGHTS_FILE
    if not weights_path.is_file():
        raise TrainerError(f"{ckpt_dir} has no {WEIGHTS_FILE}")
    if not serving and (ckpt_dir / MASTER_WEIGHTS_FILE).is_file():
        weights_path = ckpt_dir / MASTER_WEIGHTS_FILE
    tensors = load_file(str(weights_path))
    drafter = DFlashDrafter(config, embed_tokens=embed_tokens, lm_head=lm_head)
    dtype = next(iter(tensors.values())).dtype
    drafter.to(dtype=dtype)
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise TrainerError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    return drafter.to(device) if device is not None else drafter
