"""Train/serve parity: does a drafter checkpoint fit the target it will be served with? (torch-free)

Read from the files alone (the target's config.json and tokenizer files, the drafter's config.json, the header of
its model.safetensors and, in a training checkpoint, trainer_config.json), so `python -m trainer check --target
DIR --drafter CKPT` answers in a second, before a server loads anything. Each check names the config key it is
about and, when it fails, what to change. `train` runs it on its last checkpoint, `export` before it writes.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer.errors import TrainerError
from trainer.planning.dflash2 import ARCHITECTURE_NAMES, Dflash2Sizes
from trainer.planning.target_families import FULL, SLIDING, TargetSpec, drafter_shape, read_target_spec

RETRAIN = "train the drafter against this target"


@dataclass
class Check:
    key: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.key}: {self.detail}" + ("" if self.ok else f"; fix: {self.fix}")


@dataclass
class ParityReport:
    target: str
    drafter: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def lines(self) -> list[str]:
        verdict = "ok" if self.ok else f"{len(self.failed)} mismatch(es)"
        return [check.line() for check in self.checks] + [f"parity {self.drafter} vs {self.target}: {verdict}"]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "target": self.target, "drafter": self.drafter,
                "checks": [asdict(check) for check in self.checks]}


def read_json(path: Path) -> dict | None:
    """A JSON object file, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------------------------------- what is read

@dataclass
class Tokenizer:
    """The target tokenizer's ids as its files list them: special (added, special) and ordinary tokens."""

    special: dict[int, str] = field(default_factory=dict)
    ordinary: dict[int, str] = field(default_factory=dict)
    mask_token: str | None = None
    chat_template: str | None = None   # where it was found

    @property
    def size(self) -> int:
        return max([*self.special, *self.ordinary], default=-1) + 1

    def id_of(self, token: str) -> int | None:
        return next((i for i, t in {**self.ordinary, **self.special}.items() if t == token), None)


def _add_tokens(found: Tokenizer, tokens: dict[int, dict]) -> None:
    for token_id, entry in tokens.items():
        content = str(entry.get("content"))
        (found.special if entry.get("special") else found.ordinary)[int(token_id)] = content


def read_tokenizer(path: Path) -> Tokenizer | None:
    """From tokenizer.json (or vocab.json), tokenizer_config.json and chat_template.*; None when none is there."""
    found = Tokenizer()
    fast, config, vocab = (read_json(path / name) for name in ("tokenizer.json", "tokenizer_config.json",
                                                                 "vocab.json"))
    if fast is None and vocab is None:
        return None
    model_vocab = (fast or {}).get("model", {}).get("vocab") if fast else vocab
    if isinstance(model_vocab, dict):
        found.ordinary.update({int(i): str(t) for t, i in model_vocab.items() if isinstance(i, int)})
    elif isinstance(model_vocab, list):  # unigram: [[piece, score], ...]
        found.ordinary.update({i: str(entry[0]) for i, entry in enumerate(model_vocab)})
    _add_tokens(found, {entry["id"]: entry for entry in (fast or {}).get("added_tokens", []) if "id" in entry})
    _add_tokens(found, {int(i): entry for i, entry in ((config or {}).get("added_tokens_decoder") or {}).items()})
    for token_id in found.special:
        found.ordinary.pop(token_id, None)
    mask = (config or {}).get("mask_token")
    found.mask_token = mask.get("content") if isinstance(mask, dict) else mask
    for name in ("chat_template.jinja", "chat_template.json"):
        if (path / name).is_file():
            found.chat_template = name
    if (config or {}).get("chat_template"):
        found.chat_template = "tokenizer_config.json"
    return found


def safetensors_shapes(path: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape from a safetensors header (8-byte length, then JSON): no torch needed."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return None
    return {name: list(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def _rope_theta(config: dict) -> float | None:
    params = config.get("rope_parameters") or {}
    value = params.get("rope_theta") if isinstance(params, dict) else None
    value = value if value is not None else config.get("rope_theta")
    return float(value) if isinstance(value, (int, float)) else None


def _rope_scaling(config: dict) -> str | None:
    """The kind of RoPE scaling a config asks for (yarn, linear, ...), None for plain RoPE."""
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if isinstance(value, dict):
            kind = value.get("rope_type") or value.get("type")
            if kind and kind != "default":
                return str(kind)
    return None


# ---------------------------------------------------------------------------------------------- the checks

@dataclass
class Pair:
    """Everything one parity check reads."""

    spec: TargetSpec
    tokenizer: Tokenizer | None
    drafter: dict                      # the drafter's config.json
    trained: dict | None               # trainer_config.json of a training checkpoint
    shapes: dict[str, list[int]] | None

    @property
    def taps(self) -> list:
        return list((self.drafter.get("dflash_config") or {}).get("target_layer_ids") or [])


def _mask_token(pair: Pair) -> Check:
    key = "dflash_config.mask_token_id"
    mask_id = (pair.drafter.get("dflash_config") or {}).get("mask_token_id")
    vocab, tokenizer = int(pair.spec.text.get("vocab_size") or 0), pair.tokenizer
    if not isinstance(mask_id, int) or not 0 <= mask_id < vocab:
        return Check(key, False, f"{mask_id!r} is outside the target's embedding (0..{vocab - 1})", RETRAIN)
    if tokenizer is None:
        return Check(key, False, f"{mask_id}: the target has no tokenizer files to check it against",
                     "give the target directory with its tokenizer (tokenizer.json)")
    wanted = tokenizer.id_of(tokenizer.mask_token or "<|MASK|>")
    suggestion = wanted if wanted is not None else tokenizer.size if tokenizer.size < vocab else None
    fix = (f"train with mask_token_id: {suggestion} (the tokenizer's mask token or a spare embedding row)"
           if suggestion is not None else "add a special mask token to the target's tokenizer and train with it")
    trained = (pair.trained or {}).get("mask_token_id")
    if trained is not None and trained != mask_id:
        return Check(key, False, f"{mask_id}, but trainer_config.json has mask_token_id {trained}", RETRAIN)
    roles = _token_roles(pair.spec.text)
    if mask_id in roles:
        return Check(key, False, f"{mask_id} is the target's {roles[mask_id]} token: real text contains it", fix)
    if mask_id in tokenizer.special:
        return Check(key, True, f"{mask_id} is the special token {tokenizer.special[mask_id]!r}")
    if mask_id in tokenizer.ordinary:
        return Check(key, False, f"{mask_id} is the ordinary token {tokenizer.ordinary[mask_id]!r}: text that "
                                 f"contains it would read as a mask slot", fix)
    if mask_id >= tokenizer.size:
        return Check(key, True, f"{mask_id} is a spare embedding row past the tokenizer ({tokenizer.size} "
                                f"tokens): no text encodes to it")
    return Check(key, False, f"{mask_id} is not a token of the target's tokenizer", fix)


def _token_roles(text: dict) -> dict[int, str]:
    """id -> bos/eos/pad for the ids the target's config names (eos may be a list)."""
    roles = {}
    for role in ("bos", "eos", "pad"):
        value = text.get(f"{role}_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int):
                roles.setdefault(token_id, role)
    return roles


def _taps(pair: Pair) -> list[Check]:
    key, taps, layers = "dflash_config.target_layer_ids", pair.taps, pair.spec.num_layers
    if not taps or not all(isinstance(i, int) for i in taps) or taps != sorted(set(taps)):
        return [Check(key, False, f"{taps!r} is not an ascending list of distinct layer ids", RETRAIN)]
    outside = [i for i in taps if not 0 <= i < layers]
    if outside:
        return [Check(key, False, f"{outside} past the target's layers (0..{layers - 1})", RETRAIN)]
    checks = [Check(key, True, f"{taps} within the target's {layers} layers")]
    aux = pair.drafter.get("eagle_aux_hidden_state_layer_ids")
    expected = [i + 1 for i in taps]
    checks.append(Check("eagle_aux_hidden_state_layer_ids", aux == expected,
                        f"{aux} = target_layer_ids + 1" if aux == expected else
                        f"{aux}, target_layer_ids + 1 is {expected} (vLLM taps these)",
                        f"set eagle_aux_hidden_state_layer_ids to {expected} (`python -m trainer export` writes it)"))
    num = pair.drafter.get("num_target_layers")
    checks.append(Check("num_target_layers", num == layers, f"{num}" + (", as the target" if num == layers else
                                                                         f", the target has {layers}"), RETRAIN))
    if pair.trained is not None and pair.trained.get("target_layer_ids") not in (None, taps):
        checks.append(Check("target_layer_ids", False, f"trainer_config.json has {pair.trained['target_layer_ids']}, "
                                                       f"config.json {taps}", RETRAIN))
    if pair.shapes is not None and "fc.weight" in pair.shapes:
        width = len(taps) * int(pair.spec.hidden_size)
        got = pair.shapes["fc.weight"][-1]
        checks.append(Check("fc.weight", got == width, f"takes {got} features" + (
            f" = {len(taps)} taps x {pair.spec.hidden_size}" if got == width else
            f", {len(taps)} taps x hidden {pair.spec.hidden_size} is {width}"), RETRAIN))
    return checks


def _same(key: str, drafter, target, fix: str = RETRAIN, what: str = "the target's") -> Check:
    if drafter == target:
        return Check(key, True, f"{'none' if drafter is None else drafter}, as {what}")
    return Check(key, False, f"drafter {drafter}, {what} {target}", fix)


def _shape(pair: Pair) -> list[Check]:
    """Hidden size and vocabulary are the target's; head_dim and RoPE base the recipe's (target_families.py), with the
    training config's drafter_* keys over it when the checkpoint has them."""
    text, trained = pair.spec.text, pair.trained or {}
    expected = drafter_shape(pair.spec, head_dim=trained.get("drafter_head_dim"),
                             rope_theta=trained.get("drafter_rope_theta"))
    chosen = "the training config's" if trained.get("drafter_head_dim") else "the target's"
    return [
        _same("hidden_size", pair.drafter.get("hidden_size"), text.get("hidden_size")),
        _same("vocab_size", pair.drafter.get("vocab_size"), text.get("vocab_size")),
        _same("head_dim", pair.drafter.get("head_dim"), expected.head_dim, what=chosen),
        _same("rope_theta", _rope_theta(pair.drafter), float(expected.rope_theta),
              what="the training config's" if trained.get("drafter_rope_theta") else "the target's"),
        _same("rope_scaling", _rope_scaling(pair.drafter), _rope_scaling(text),
              "the trainer trains plain RoPE only: serve a target without rope scaling, or train for it"),
    ]


def _block_size(pair: Pair) -> Check:
    block, trained = pair.drafter.get("block_size"), (pair.trained or {}).get("block_size")
    if not isinstance(block, int) or block < 2:
        return Check("block_size", False, f"{block!r} is not a block of at least 2 slots", RETRAIN)
    if trained is not None and trained != block:
        return Check("block_size", False, f"{block}, but it was trained with block_size {trained}",
                     f"set block_size to {trained}")
    return Check("block_size", True, f"{block} slots" + (", as trained" if trained is not None else ""))


def _dflash2(pair: Pair) -> list[Check]:
    """A DFlash2 drafter's nested sizes: whole, fitting the target, as trained, and matching its tensors."""
    if pair.drafter.get("architectures") != [ARCHITECTURE_NAMES["dflash2"]]:
        return []
    nested, trained = pair.drafter.get("dflash_config") or {}, pair.trained or {}
    keys = [*Dflash2Sizes.__dataclass_fields__, "block_size"]
    bad = [key for key in keys if not isinstance(nested.get(key), int) or nested[key] < 1]
    if bad:
        return [Check(f"dflash_config.{key}", False, f"{nested.get(key)!r} is not a positive integer", RETRAIN)
                for key in bad]
    sizes = Dflash2Sizes.from_mapping(nested)
    hidden, vocab = int(pair.spec.hidden_size), int(pair.spec.text.get("vocab_size") or 0)
    checks = [Check("dflash_config", False, problem, RETRAIN)
              for _, problem in sizes.problems(hidden_size=hidden, vocab_size=vocab)]
    checks += [Check(f"dflash_config.{key}", False, f"{nested[key]}, but it was trained with {key} {trained[key]}",
                     f"set dflash_config.{key} to {trained[key]}")
               for key in keys if trained.get(key) is not None and trained[key] != nested[key]]
    if pair.drafter.get("block_size", nested["block_size"]) != nested["block_size"]:
        checks.append(Check("dflash_config.block_size", False, f"{nested['block_size']}, the top-level block_size "
                                                               f"is {pair.drafter['block_size']}", RETRAIN))
    expected = {"candidate_selector.predecessor_codebook": [vocab, sizes.selector_rank],
                "layers.0.attention_conv.kernel_projection.weight":
                    [2 * sizes.conv_kernel_size * hidden // sizes.conv_group_size, hidden]}
    for name, shape in expected.items():
        got = (pair.shapes or {}).get(name, shape)
        if got != shape:
            checks.append(Check(name, False, f"is {got}, dflash_config's sizes make it {shape}", RETRAIN))
    return checks or [Check("dflash_config", True, ", ".join(f"{key} {nested[key]}" for key in keys))]


def _sliding_layout(pair: Pair) -> Check:
    """Which layers slide, against use_sliding_window, the window, the block and the training config."""
    config, trained = pair.drafter, (pair.trained or {}).get("sliding_window")
    layers, block, window = config.get("num_hidden_layers"), config.get("block_size"), config.get("sliding_window")
    types = config.get("layer_types") or [FULL] * (layers if isinstance(layers, int) else 0)
    sliding = SLIDING in types
    problem = None
    if len(types) != layers or set(types) - {FULL, SLIDING}:
        problem = f"{len(types)} entries of {sorted(set(types))} for {layers} layers"
    elif bool(config.get("use_sliding_window")) != sliding:
        problem = f"use_sliding_window is {config.get('use_sliding_window')} with layer_types {types}"
    elif sliding and (not isinstance(window, int) or not isinstance(block, int) or window < block):
        problem = f"sliding_window {window!r} is smaller than a block ({block})"
    elif trained is not None and (trained or None) != (window if sliding else None):
        problem = f"sliding_window {window if sliding else None}, trained with {trained}"
    if problem:
        return Check("layer_types", False, problem, RETRAIN)
    return Check("layer_types", True, f"{types.count(SLIDING)} sliding (window {window}), {types.count(FULL)} full"
                 if sliding else f"{len(types)} full-attention layers")


def _chat_template(pair: Pair) -> Check:
    where = pair.tokenizer.chat_template if pair.tokenizer else None
    return Check("chat_template", where is not None, f"in the target's {where}" if where else
                 "the target has none: chat requests cannot be formatted as the drafter's training data was",
                 "copy the target model's chat_template.jinja (or tokenizer_config.json) into the target directory")


def read_pair(target: str | Path, drafter: str | Path) -> Pair:
    target, drafter = Path(target), Path(drafter)
    spec = read_target_spec(target)
    config = read_json(drafter / "config.json")
    if config is None:
        raise TrainerError(f"{drafter} is not a drafter checkpoint (no readable config.json)")
    if "dflash_config" not in config:
        raise TrainerError(f"{drafter}/config.json is not a DFlash drafter's (no dflash_config)")
    return Pair(spec=spec, tokenizer=read_tokenizer(target), drafter=config,
                trained=read_json(drafter / "trainer_config.json"),
                shapes=safetensors_shapes(drafter / "model.safetensors"))


def check_parity(target: str | Path, drafter: str | Path) -> ParityReport:
    """Every check of the drafter in `drafter` against the target in `target`; a TrainerError when either
    directory is not what it should be at all."""
    pair = read_pair(target, drafter)
    report = ParityReport(target=str(target), drafter=str(drafter))
    report.checks += [_mask_token(pair), *_taps(pair), *_shape(pair), _block_size(pair), *_dflash2(pair),
                      _sliding_layout(pair), _chat_template(pair)]
    return report
