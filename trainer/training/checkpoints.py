"""Training checkpoints: `step_N/` is the drafter on disk (trainer/model/drafter_files.py) plus the training state
(optimizer, scheduler, RNG, data position), the fp32 master weights when model.safetensors holds a lower precision
(save_dtype), and the resolved config; it appears whole or not at all (written under a temporary name, then
renamed). Which checkpoint a run resumes from, and whether its config allows it, is decided here too.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dflash_records.digest import MANIFEST_FILE, sha256_of
from dflash_records.digits import ascii_decimal
from trainer.errors import TrainerError
from trainer.model.drafter_files import (CONFIG_FILE, DTYPES, MASTER_WEIGHTS_FILE, WEIGHTS_FILE, drafter_tensors,
                                         make_readable, save_drafter, save_weights)
from trainer.model.drafter import unwrap
from trainer.training.checkpoint_space import (check_room, disk_full_error, estimate_save_bytes, is_disk_full,
                                               state_bytes)

if TYPE_CHECKING:
    from trainer.config import TrainConfig

STATE_FILE = "training_state.pt"
TRAINER_CONFIG_FILE = "trainer_config.json"  # the resolved training config, readable without torch
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, STATE_FILE, TRAINER_CONFIG_FILE)
# config keys that shape the drafter or the data order: a checkpoint resumes only with the same values
RESUME_KEYS = ("block_size", "drafter_layers", "target_layer_ids", "sliding_window", "drafter_heads",
               "drafter_kv_heads", "drafter_head_dim", "drafter_intermediate_size", "drafter_rope_theta",
               "mask_token_id", "seed", "buckets", "token_budget", "max_length", "overlong", "architecture",
               "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# what a checkpoint written before a key existed meant by its absence
RESUME_DEFAULTS = {"architecture": "dflash"}


def complete_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every step_N/ holding all its files, oldest first; temp dirs are never named step_N."""
    found = []
    for path in output_dir.glob("step_*"):
        step = ascii_decimal(path.name.removeprefix("step_"))
        if step is not None and all((path / name).is_file() for name in CHECKPOINT_FILES):
            found.append((step, path))
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
    saved = {key: saved.get(key, RESUME_DEFAULTS.get(key)) for key in RESUME_KEYS}
    changed = [key for key in RESUME_KEYS if saved[key] != getattr(cfg, key)]
    if changed:
        details = ", ".join(f"{key}: {saved[key]!r} -> {getattr(cfg, key)!r}" for key in changed)
        raise TrainerError(f"cannot resume from {resume_dir}: the config changed ({details}); "
                           f"use --resume never or a new output_dir")


def save_checkpoint(output_dir: Path, step: int, *, drafter, state: dict, keep: int,
                    save_dtype: str = "float32") -> Path:
    """Write step_N/ into a temp dir and rename it: a kill mid-write never leaves a complete-looking step_N.

    model.safetensors is written in `save_dtype`; when that is not the training dtype, the master weights go
    to master_weights.safetensors as they are, and a resumed run loads those. The disk must have room for the
    whole save first (DiskFull otherwise, nothing written); a save that still meets a full disk is removed and
    raised as DiskFull. Older checkpoints beyond `keep` go only once the new one is complete."""
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(output_dir)
    needed = save_size(drafter, state, save_dtype)
    check_room(output_dir, needed)
    final = output_dir / f"step_{step}"
    temp = output_dir / f".tmp-step_{step}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        _write_files(temp, drafter=drafter, state=state, save_dtype=save_dtype)
    except Exception as exc:
        shutil.rmtree(temp, ignore_errors=True)  # a partial save must not eat the space of the next one
        if is_disk_full(exc):
            raise disk_full_error(output_dir, needed) from exc
        raise
    _replace(temp, final)
    prune_checkpoints(output_dir, keep, newest=final)
    return final


def save_size(drafter, state: dict, save_dtype: str) -> int:
    """The estimated bytes of the save: weights in save_dtype, fp32 masters where they differ, the state."""
    tensors = unwrap(drafter).state_dict()
    master_bytes = max((t.element_size() for t in tensors.values() if t.is_floating_point()), default=4)
    return estimate_save_bytes(state_bytes(tensors), save_dtype_bytes=DTYPES[save_dtype].itemsize,
                               master_dtype_bytes=master_bytes, state=state)


def _write_files(temp: Path, *, drafter, state: dict, save_dtype: str) -> None:
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
    write_manifest(temp)


def write_manifest(directory: Path) -> Path:
    """manifest.json: every file's size and sha256, the last file a save writes (read back in chunks)."""
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != MANIFEST_FILE:
            files[path.name] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    manifest = directory / MANIFEST_FILE
    manifest.write_text(json.dumps({"version": 1, "files": files}, indent=2) + "\n")
    make_readable(manifest)
    with open(manifest, "rb") as handle:
        os.fsync(handle.fileno())
    return manifest


def _replace(temp: Path, final: Path) -> None:
    """temp becomes final; a final already there (the same step saved again) is moved aside first and removed
    only after, so no moment passes without a complete step_N."""
    aside = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    os.rename(temp, final)
    shutil.rmtree(aside, ignore_errors=True)


def prune_checkpoints(output_dir: Path, keep: int, *, newest: Path) -> list[Path]:
    """Remove complete checkpoints beyond the newest `keep` (0 keeps all); `newest`, the save just completed,
    always counts as one of them, whatever its step (a run resumed from an older checkpoint saves lower steps)."""
    if not keep:
        return []
    others = [path for _, path in complete_checkpoints(output_dir) if path != newest]
    doomed = others[:max(0, len(others) - (keep - 1))]
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)
    return doomed


def remove_stale_temps(output_dir: Path) -> None:
    """Temp dirs of saves whose process is gone (killed mid-save) hold space the next save needs."""
    for path in output_dir.glob(".tmp-step_*-*"):
        pid = ascii_decimal(path.name.rsplit("-", 1)[-1])
        if pid is not None and pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(path, ignore_errors=True)


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
