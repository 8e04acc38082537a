"""`python -m trainer export CKPT OUT`: a serving-only copy of a drafter checkpoint.

OUT holds config.json (with auto_map and eagle_aux_hidden_state_layer_ids, added to checkpoints written before
they existed), model.safetensors in the chosen dtype (cast from the fp32 master weights where the checkpoint has
them), dflash.py (trainer/model/modeling_dflash.py) and a README.md card; no optimizer state, no master weights, no
training config. The train/serve parity check against the target runs first: a drafter that does not fit its
target is not exported. OUT appears whole or not at all.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dflash_records.digits import ascii_decimal
from trainer.objectives import objective_text, parse_loss
from trainer.errors import TrainerError, about_path
from trainer.planning.parity import ParityReport, check_parity, read_json

README_FILE = "README.md"


@dataclass
class ExportResult:
    out: str
    ok: bool
    files: list[str] = field(default_factory=list)
    parity: ParityReport | None = None

    def lines(self) -> list[str]:
        lines = self.parity.lines() if self.parity else ["parity check skipped (--no-check)"]
        if self.ok:
            lines.append(f"Exported to {self.out}: {', '.join(self.files)}")
        else:
            lines.append(f"Nothing written to {self.out}: the drafter does not fit its target (lines above)")
        return lines

    def as_dict(self) -> dict:
        return {"ok": self.ok, "out": self.out, "files": self.files,
                "parity": self.parity.as_dict() if self.parity else None}


def training_facts(ckpt: Path) -> dict:
    """Steps, target, the latest eval tau and the latest held-out replay (chain and tree tau) of a step_N
    checkpoint, from what its run left next to it."""
    trained = read_json(ckpt / "trainer_config.json") or {}
    suffix = ckpt.resolve().name.removeprefix("step_")
    step = ascii_decimal(suffix)
    tau = heldout = None
    try:
        lines = (ckpt.resolve().parent / "metrics.jsonl").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        # tau_eval: real speculative decoding of held-out prompts (eval_prompts), as the trainer writes it
        if isinstance(record, dict) and isinstance(record.get("tau_eval"), (int, float)) and (
                step is None or not isinstance(record.get("step"), int) or record["step"] <= step):
            tau = (record["tau_eval"], record.get("step"))
        heldout = _heldout_taus(record, step) or heldout
    return {"step": step, "target": trained.get("target_path"), "tau": tau, "heldout": heldout,
            "objective": objective_of(trained)}


def _heldout_taus(record, step: int | None) -> dict | None:
    """The held-out chain and tree tau of a step record up to `step`, None for any other line."""
    if not isinstance(record, dict) or record.get("event") != "step" or not isinstance(record.get("step"), int):
        return None
    chain, trees = record.get("tau_heldout"), record.get("tau_tree_heldout")
    chain = chain if isinstance(chain, (int, float)) else None
    trees = trees if isinstance(trees, dict) else {}
    if (step is not None and record["step"] > step) or (chain is None and not trees):
        return None
    try:
        trees = {int(budget): float(tau) for budget, tau in sorted(trees.items(), key=lambda kv: int(kv[0]))}
    except (TypeError, ValueError):
        trees = {}
    return {"step": record["step"], "chain": chain, "trees": trees}


def _heldout_row(heldout: dict | None) -> str:
    if not heldout:
        return "(not measured: eval_every sets it)"
    parts = [f"chain {heldout['chain']:.2f}"] if heldout["chain"] is not None else []
    if heldout["trees"]:
        parts.append("DDTree " + ", ".join(f"{budget} nodes {tau:.2f}" for budget, tau in heldout["trees"].items()))
    return "; ".join(parts) + f" (step {heldout['step']})"


def objective_of(trained: dict) -> str | None:
    """The training objective a checkpoint's trainer config records; runs from before `loss:` existed trained
    with decay-weighted CE, the only objective then."""
    if not trained:
        return None
    try:
        return objective_text(parse_loss(trained.get("loss", "ce")), trained.get("slot_weights", "decay"))
    except ValueError:
        return f"{trained.get('loss')!r} (unknown)"


def _counted(count: int, noun: str) -> str:
    """`1 layer`, `5 layers`: the card reads as English for a one-layer drafter too."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def model_card(config: dict, facts: dict, dtype: str) -> str:
    dflash = config["dflash_config"]
    window = (f"sliding window {config['sliding_window']} on "
              f"{config['layer_types'].count('sliding_attention')} of {_counted(config['num_hidden_layers'], 'layer')}"
              if config.get("use_sliding_window") else "full attention in every layer")
    tau = facts["tau"]
    rows = [
        ("Target", facts["target"] or "(not recorded)"),
        ("Target layers tapped", f"{dflash['target_layer_ids']} (vLLM aux ids "
                                 f"{config['eagle_aux_hidden_state_layer_ids']}) of {config['num_target_layers']}"),
        ("Architecture", (config.get("architectures") or ["DFlashDraftModel"])[0]),
        ("Block size", f"{config['block_size']} (slot 0 the anchor, {config['block_size'] - 1} drafted tokens)"),
        ("Mask token id", dflash["mask_token_id"]),
        ("Drafter", f"{_counted(config['num_hidden_layers'], 'layer')}, hidden {config['hidden_size']}, "
                    f"{_counted(config['num_attention_heads'], 'head')} / {config['num_key_value_heads']} KV x "
                    f"{config['head_dim']}, {window}"),
        *([("DFlash2", f"two-tap block convolution (kernel {dflash['conv_kernel_size']}, groups of "
                       f"{dflash['conv_group_size']} channels), selector of rank {dflash['selector_rank']} over the "
                       f"top {dflash['selector_top_k']} candidates")] if "selector_top_k" in dflash else []),
        ("Weights", dtype),
        ("Training steps", facts["step"] if facts["step"] is not None else "(not recorded)"),
        ("Training objective", facts.get("objective") or "(not recorded)"),
        ("Eval tau", f"{tau[0]:.2f} (step {tau[1]})" if tau else "(not measured: eval_prompts sets it)"),
        ("Held-out tau, replayed", _heldout_row(facts.get("heldout"))),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"""# DFlash drafter

A block-diffusion speculative-decoding drafter. It uses the target's embedding and LM head, which it does not
contain: serve it next to its target.

| | |
|---|---|
{table}

```python
from transformers import AutoModel
drafter = AutoModel.from_pretrained("PATH", trust_remote_code=True)
# forward(target_hidden, noise_embedding, anchors): see dflash.py
```

SGLang and vLLM load this directory as a DFlash draft model (config.json's `dflash_config`).
"""


def _serving_files(ckpt: Path, temp: Path, dtype: str) -> dict:
    """Write config.json, model.safetensors and dflash.py into temp; the config written."""
    from safetensors.torch import load_file

    from trainer.model.drafter_files import (CONFIG_FILE, DTYPES, MASTER_WEIGHTS_FILE, WEIGHTS_FILE, make_readable,
                                             read_drafter_config, save_weights, serving_config, write_modeling_file)

    source = ckpt / MASTER_WEIGHTS_FILE if (ckpt / MASTER_WEIGHTS_FILE).is_file() else ckpt / WEIGHTS_FILE
    if not source.is_file():
        raise TrainerError(f"{ckpt} has no {WEIGHTS_FILE}")
    tensors = {name: (t.to(DTYPES[dtype]) if t.is_floating_point() else t).contiguous()
               for name, t in load_file(str(source)).items()}
    save_weights(tensors, temp / WEIGHTS_FILE)
    original = json.loads((ckpt / CONFIG_FILE).read_text())
    config = {**original, **serving_config(read_drafter_config(ckpt), DTYPES[dtype])}
    (temp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    make_readable(temp / CONFIG_FILE)
    write_modeling_file(temp)
    return config


def export(checkpoint: str | Path, out: str | Path, *, target: str | Path | None = None, dtype: str = "bfloat16",
           check: bool = True, force: bool = False) -> ExportResult:
    from trainer.model.drafter_files import make_readable, read_drafter_config

    ckpt, out = Path(checkpoint), Path(out)
    read_drafter_config(ckpt)  # a TrainerError when it is not a drafter checkpoint
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise TrainerError(f"{out} exists and is not an empty directory (--force writes into it)")
    facts = training_facts(ckpt)
    parity = None
    if check:
        if target is None and facts["target"] and not (Path(facts["target"]) / "config.json").is_file():
            raise TrainerError(f"the target {ckpt} was trained against, {facts['target']}, is not here: give "
                               f"--target DIR (or --no-check)")
        target = target or facts["target"]
        if not target:
            raise TrainerError(f"{ckpt} does not record its target: give --target DIR (or --no-check)")
        parity = check_parity(target, ckpt)
        if not parity.ok:
            return ExportResult(out=str(out), ok=False, parity=parity)
    temp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    with about_path(out, "write the export to"):  # OUT under a file, or where nothing can be made
        temp.mkdir(parents=True)
    try:
        config = _serving_files(ckpt, temp, dtype)
        (temp / README_FILE).write_text(model_card(config, {**facts, "target": str(target or facts["target"] or "")
                                                            or None}, dtype))
        make_readable(temp / README_FILE)
        _move_into_place(temp, out)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return ExportResult(out=str(out), ok=True, files=sorted(p.name for p in out.iterdir()), parity=parity)


def _move_into_place(temp: Path, out: Path) -> None:
    """The finished files into OUT: the whole directory renamed, or each file into an OUT that exists."""
    with about_path(out, "write the export to"):
        if out.exists():
            for path in temp.iterdir():
                os.replace(path, out / path.name)
            temp.rmdir()
        else:
            os.rename(temp, out)
