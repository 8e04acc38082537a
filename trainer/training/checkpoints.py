"""The drafter on disk, in the layout SGLang and vLLM load: config.json + model.safetensors, no embedding/LM head,
plus `dflash.py` (trainer/model/modeling_dflash.py, named by config.json's auto_map) so that transformers loads it too.

A training checkpoint `step_N/` adds the training state (optimizer, scheduler, RNG, data position), the fp32
master weights when model.safetensors holds a lower precision (save_dtype), and the resolved config; it appears
whole or not at all (written under a temporary name, then renamed). Every file is readable as the umask allows
(644 by default), so a server run by another user can load it. Which checkpoint a run resumes from, and whether
its config allows it, is decided here too.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainer.model.drafter import DFlashDrafter, DrafterConfig, unwrap
from trainer.errors import TrainerError

if TYPE_CHECKING:
    from trainer.config import TrainConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODELING_FILE = "dflash.py"   # the public DFlash checkpoints' name: auto_map "dflash.DFlashDraftModel"
STATE_FILE = "training_state.pt"
MASTER_WEIGHTS_FILE = "master_weights.safetensors"  # fp32, written when model.safetensors is not
TRAINER_CONFIG_FILE = "trainer_config.json"  # the resolved training config, readable without torch
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, STATE_FILE, TRAINER_CONFIG_FILE)
TRAINING_FILES = (STATE_FILE, MASTER_WEIGHTS_FILE, TRAINER_CONFIG_FILE)  # what a serving copy leaves out
# config keys that shape the drafter or the data order: a checkpoint resumes only with the same values
RESUME_KEYS = ("block_size", "drafter_layers", "target_layer_ids", "sliding_window", "drafter_heads",
               "drafter_kv_heads", "drafter_head_dim", "drafter_intermediate_size", "drafter_rope_theta",
               "mask_token_id", "seed", "buckets", "token_budget", "max_length", "overlong")
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
    data["auto_map"] = {"AutoModel": f"{Path(MODELING_FILE).stem}.DFlashDraftModel"}
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


# --------------------------------------------------------------------------- training checkpoints and resume

def complete_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every step_N/ holding all its files, oldest first; temp dirs are never named step_N."""
    found = []
    for path in output_dir.glob("step_*"):
        suffix = path.name.removeprefix("step_")
        if suffix.isdigit() and all((path / name).is_file() for name in CHECKPOINT_FILES):
            found.append((int(suffix), path))
    return sorted(found)


def choose_resume_dir(cfg: TrainConfig) -> Path | None:
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        found = complete_checkpoints(Path(cfg.output_dir))
        return found[-1][1] if found else None
    path = Path(cfg.resume)
    if not all((path / name).is_file() for name in CHECKPOINT_FILES):
        raise TrainerError(f"resume: {path} is not a complete checkpoint (needs {', '.join(CHECKPOINT_FILES)})")
    return path


def check_resumable(resume_dir: Path, cfg: TrainConfig) -> None:
    saved = json.loads((resume_dir / TRAINER_CONFIG_FILE).read_text())
    changed = [key for key in RESUME_KEYS if saved.get(key) != getattr(cfg, key)]
    if changed:
        details = ", ".join(f"{key}: {saved.get(key)!r} -> {getattr(cfg, key)!r}" for key in changed)
        raise TrainerError(f"cannot resume from {resume_dir}: the config changed ({details}); "
                           f"use --resume never or a new output_dir")


def save_checkpoint(output_dir: Path, step: int, *, drafter, state: dict, keep: int,
                    save_dtype: str = "float32") -> Path:
    """Write step_N/ into a temp dir and rename it: a kill mid-write never leaves a complete-looking step_N.

    model.safetensors is written in `save_dtype`; when that is not the training dtype, the master weights go
    to master_weights.safetensors as they are, and a resumed run loads those."""
    final = output_dir / f"step_{step}"
    temp = output_dir / f".tmp-step_{step}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    dtype = DTYPES[save_dtype]
    save_drafter(drafter, temp, dtype=dtype)
    master = drafter_tensors(drafter)
    if any(t.is_floating_point() and t.dtype != dtype for t in master.values()):
        save_weights(master, temp / MASTER_WEIGHTS_FILE)
    torch.save(state, temp / STATE_FILE)
    (temp / TRAINER_CONFIG_FILE).write_text(json.dumps(state["config"], indent=2))
    for path in temp.iterdir():
        make_readable(path)
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(temp, final)
    if keep:
        for _, old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def rng_state(generator) -> dict:
    import numpy as np

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "anchors": generator.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, generator) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["anchors"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def agree_on_resume(resume_dir: Path | None, ctx) -> tuple[Path | None, bool]:
    """Rank 0's choice of checkpoint holds for the whole job, and whether this rank can read it itself.

    In a job across hosts only the first node has the checkpoints (rank 0 writes them): the other nodes must
    resume from the same step, with the state rank 0 sends them, not start fresh.
    """
    from trainer.training.distributed import broadcast_object

    chosen = broadcast_object(str(resume_dir) if resume_dir is not None else None, ctx)
    if chosen is None:
        return None, False
    path = Path(chosen)
    return path, (path / STATE_FILE).is_file()


def resume_state(resume_dir: Path, local: bool, ctx) -> dict:
    """The training state of the checkpoint: read from disk, or from rank 0 where this node lacks the files."""
    from trainer.training.distributed import any_rank, broadcast_object

    state = torch.load(resume_dir / STATE_FILE, map_location="cpu", weights_only=False) if local else None
    if any_rank(not local, ctx):  # only pay for the broadcast when some rank cannot read the checkpoint
        state = broadcast_object(state, ctx)
    return state


def gather_to_main(value, ctx) -> list:
    import torch.distributed as dist

    if not ctx.is_distributed:
        return [value]
    gathered = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered
