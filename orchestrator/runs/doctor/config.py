"""What a trainer config needs of a target: its paths there and on disk (tmpfs is lost on a container
restart), room for `keep_checkpoints` checkpoints, /dev/shm for its processes. These are the checks that
`launch --config` runs first."""
from __future__ import annotations

from ...display import format_bytes
from .facts import Facts
from .report import FAIL, OK, WARN, Row, see
from .storage import NCCL_SHM_BYTES, shm_fix

BYTES_PER_PARAM = 14   # bf16 weights (model.safetensors) + fp32 master weights + AdamW's two moments, per step_N/
READ_KEYS = ("target_path", "data_path")
VOLATILE = ("tmpfs", "ramfs")


def _config_paths(facts: Facts):
    """(key, path, its filesystem facts) of the config's paths, placed as the trainer's check places them
    (facts.resolved_paths)."""
    for key, path in facts.paths.items():
        yield key, path, (facts.probe.paths or {}).get(path) or {}


def missing_paths(facts: Facts) -> list[Row]:
    """The target and data paths are there (doctor only: at launch the trainer's own check says it, better)."""
    return [Row(f"config.{key}", FAIL, f"{path} does not exist on {facts.target.name}",
                f"copy it there or correct `{key}` in {facts.needs.source}")
            for key, path, fs in _config_paths(facts) if key in READ_KEYS and not fs.get("exists")]


def volatile_paths(facts: Facts) -> list[Row]:
    rows = []
    for key, path, fs in _config_paths(facts):
        if key in READ_KEYS and not fs.get("exists"):
            continue
        if fs.get("fstype") in VOLATILE:
            rows.append(Row(f"config.{key}", FAIL, f"{path} is on {fs['fstype']} ({fs.get('mount_point')}): lost on "
                                                   "container restart",
                            f"copy it to disk (`cp -a {path} {facts.target.workdir}/`) and point `{key}` there, "
                            f"or launch with --force; {see('tmpfs')}"))
        else:
            rows.append(Row(f"config.{key}", OK, f"{path} on {fs.get('fstype', '?')}"))
    return rows


def drafter_params(model: dict, layers: int) -> int | None:
    """Parameters of a drafter of `layers` layers shaped like the target (its taps' fc included)."""
    config = model.get("text_config") if "hidden_size" not in model else model
    try:
        h, i = int(config["hidden_size"]), int(config["intermediate_size"])
        heads = int(config["num_attention_heads"])
        kv = int(config.get("num_key_value_heads") or heads)
        d = int(config.get("head_dim") or h // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    per_layer = 2 * h * heads * d + 2 * h * kv * d + 3 * h * i
    return layers * per_layer + layers * h * h


def checkpoint_space(facts: Facts) -> Row | None:
    needs = facts.needs
    if needs is None:
        return None
    model = (facts.probe.model or {}).get("config")
    params = drafter_params(model, needs.drafter_layers) if model else None
    if params is None:
        return Row("config.checkpoints", OK, "size not estimated (the target's config.json was not read)")
    size = params * BYTES_PER_PARAM
    if needs.checkpoint_every == 0:
        count = 1
    elif needs.keep_checkpoints:
        count = needs.keep_checkpoints + 1   # the next one is written before the oldest goes
    else:
        count = needs.max_steps // needs.checkpoint_every + 1 if needs.max_steps else None
    out = facts.paths.get("output_dir", "")
    fs = (facts.probe.paths or {}).get(out) if out else facts.probe.workdir
    free = (fs or {}).get("free_bytes")
    if count is None:
        return Row("config.checkpoints", WARN, f"~{format_bytes(size)} per checkpoint and keep_checkpoints: 0 keeps "
                                               "every one", f"set keep_checkpoints in {needs.source}")
    want = size * count
    found = f"~{format_bytes(size)} per checkpoint x {count} = {format_bytes(want)}, {format_bytes(free)} free"
    if free is not None and want > free:
        return Row("config.checkpoints", FAIL, found,
                   f"free space there, lower keep_checkpoints, or point output_dir at a bigger disk; {see('room')}")
    return Row("config.checkpoints", OK, found)


def shm_for_run(facts: Facts) -> Row | None:
    """The trainer's data workers are threads; what needs /dev/shm is NCCL between a node's processes."""
    if facts.needs is None or facts.nproc < 2:
        return None
    size = (facts.probe.shm or {}).get("total_bytes") or 0
    if size < NCCL_SHM_BYTES:
        return Row("config.shm", FAIL, f"/dev/shm is {format_bytes(size)}; NCCL between {facts.nproc} processes "
                                       f"needs {format_bytes(NCCL_SHM_BYTES)}", shm_fix(facts))
    return Row("config.shm", OK, f"/dev/shm {format_bytes(size)} for {facts.nproc} processes")
