"""`prepare`: JSONL chat records (or prompt/completion pairs) -> the tokenized Arrow dataset the trainer reads
(trainer/data/batches.py), with the loss mask on the assistant's tokens; offline, before any training run."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.errors import TrainerError, about_path
from trainer.planning.preflight import HELDOUT_DIR

DATASET_MARKER = "dataset_info.json"  # what save_to_disk writes into every dataset directory


@dataclass
class PrepareReport:
    records: int = 0
    kept: int = 0
    too_few_supervised: int = 0
    overlong_truncated: int = 0
    overlong_dropped: int = 0
    tokens: int = 0
    torn_last_line: bool = False
    set_aside: int = 0  # samples of the held-out split (not in `kept`)

    def lines(self, output: str) -> list[str]:
        return [
            f"Read {self.records} records; wrote {self.kept} samples ({self.tokens} tokens) to {output}",
            f"  dropped {self.too_few_supervised} with fewer than 2*block_size supervised tokens",
            f"  over-long: {self.overlong_truncated} truncated, {self.overlong_dropped} dropped",
            f"  held out: {self.set_aside} samples in {output}/heldout (never trained on)" if self.set_aside
            else "  held out: none",
        ] + (["  skipped a cut-off last line (a generate still running, or killed)"] if self.torn_last_line else [])


def record_messages(record: object, *, where: str) -> list[dict[str, str]]:
    """The chat of a JSONL record: {"messages": [...]} or {"prompt": ..., "completion": ...}."""
    if isinstance(record, dict) and isinstance(record.get("messages"), list):
        messages = record["messages"]
    elif isinstance(record, dict) and "prompt" in record and "completion" in record:
        prompt = record["prompt"]
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        messages = [*messages, {"role": "assistant", "content": record["completion"]}]
    else:
        raise TrainerError(f"{where}: expected {{\"messages\": [...]}} or {{\"prompt\", \"completion\"}}")
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise TrainerError(f"{where}: every message needs a string 'role' and 'content'")
    return messages


def _assistant_spans(text: str, messages: list[dict[str, str]], end_marker: str | None) -> list[tuple[int, int]]:
    """Character spans of the assistant contents in the rendered chat, each with its end-of-turn marker."""
    spans, cursor = [], 0
    for message in messages:
        if not message["content"]:
            continue
        start = text.find(message["content"], cursor)
        if start < 0:
            continue
        end = start + len(message["content"])
        if message["role"] == "assistant":
            if end_marker and text.startswith(end_marker, end):
                end += len(end_marker)  # the drafter must also learn where the turn ends
            spans.append((start, end))
        cursor = end
    return spans


def _tokenize_spans(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Tokens of `text` and a mask that is 1 on tokens overlapping any of the character spans."""
    if tokenizer.is_fast:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(offsets), dtype=bool)
        for start, end in spans:
            mask |= (offsets[:, 0] < end) & (offsets[:, 1] > start)
        return list(encoded["input_ids"]), mask.astype(np.int8).tolist()
    ids, mask, cursor = [], [], 0  # slow tokenizers have no offsets: tokenize piece by piece
    for start, end in [*spans, (len(text), len(text))]:
        for piece, supervised in ((text[cursor:start], 0), (text[start:end], 1)):
            piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
            ids += piece_ids
            mask += [supervised] * len(piece_ids)
        cursor = end
    return ids, mask


def tokenize_chat(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """input_ids of the chat as the target's template renders it, and a loss mask on the assistant tokens."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return _tokenize_spans(tokenizer, text, _assistant_spans(text, messages, tokenizer.eos_token))


def tokenize_with_answer_ids(tokenizer, messages: list[dict[str, str]],
                             answer_ids: list[int]) -> tuple[list[int], list[int]] | None:
    """Like tokenize_chat, but the last assistant turn is the target's own token ids (as `generate` records
    them), not a re-tokenization of their decoded text, which need not give the same tokens back.
    None when the template does not render the chat as prompt + answer + end of turn."""
    prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    answer = messages[-1]["content"]
    if not full.startswith(prompt) or not full[len(prompt):].startswith(answer):
        return None
    tail = full[len(prompt) + len(answer):]
    prompt_ids, prompt_mask = _tokenize_spans(
        tokenizer, prompt, _assistant_spans(prompt, messages[:-1], tokenizer.eos_token))
    marker = tokenizer.eos_token if tokenizer.eos_token and tail.startswith(tokenizer.eos_token) else ""
    tail_ids, tail_mask = _tokenize_spans(tokenizer, tail, [(0, len(marker))] if marker else [])
    return (prompt_ids + list(answer_ids) + tail_ids,
            prompt_mask + [1] * len(answer_ids) + tail_mask)


def tokenize_record(tokenizer, record: object, *, where: str) -> tuple[list[int], list[int]]:
    messages = record_messages(record, where=where)
    answer_ids = record.get("completion_token_ids") if isinstance(record, dict) else None
    if isinstance(answer_ids, list) and messages and messages[-1]["role"] == "assistant":
        exact = tokenize_with_answer_ids(tokenizer, messages, answer_ids)
        if exact is not None:
            return exact
    return tokenize_chat(tokenizer, messages)


def _read_jsonl(path: Path, report: PrepareReport):
    """Records in file order, whatever their order of `index` (generate writes answers as they finish). A last
    line with no newline that is not JSON is a record being written: skipped, and the report says so."""
    import json

    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TrainerError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                                   f"{exc.start} of the line): JSONL is UTF-8; convert the file") from None
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                if not line.endswith("\n"):
                    report.torn_last_line = True
                    return
                raise TrainerError(f"{path}:{number}: invalid JSON: {exc.msg}") from None


def is_heldout(messages: list[dict[str, str]], share: float) -> bool:
    """Whether a sample belongs to the held-out split: a hash of its chat, below `share` of the hash range. The
    same chat always lands on the same side, whatever the file's order or the record's index."""
    import hashlib
    import json

    if share <= 0:
        return False
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") / 2 ** 64 < share


def _tokenized_batches(tokenizer, input_path: Path, report: PrepareReport, *, min_supervised: int,
                       max_length: int | None, overlong: str, heldout: float = 0.0, chunk: int = 1024):
    """("train" | "heldout", Arrow record batch) pairs, each side flushed every `chunk` rows and at the end."""
    import pyarrow as pa

    sides: dict[str, dict[str, list]] = {side: {"input_ids": [], "loss_mask": [], "length": []}
                                         for side in ("train", "heldout")}
    for where, record in _read_jsonl(input_path, report):
        report.records += 1
        ids, mask = tokenize_record(tokenizer, record, where=where)
        if max_length is not None and len(ids) > max_length:
            if overlong == "drop":
                report.overlong_dropped += 1
                continue
            ids, mask = ids[:max_length], mask[:max_length]
            report.overlong_truncated += 1
        if sum(mask) < min_supervised:
            report.too_few_supervised += 1
            continue
        side = "heldout" if is_heldout(record_messages(record, where=where), heldout) else "train"
        if side == "heldout":
            report.set_aside += 1
        else:
            report.kept += 1
            report.tokens += len(ids)
        rows = sides[side]
        for key, value in (("input_ids", ids), ("loss_mask", mask), ("length", len(ids))):
            rows[key].append(value)
        if len(rows["length"]) >= chunk:
            yield side, pa.record_batch(_arrow_columns(rows))
            sides[side] = {key: [] for key in rows}
    for side, rows in sides.items():
        yield side, pa.record_batch(_arrow_columns(rows))


def _arrow_columns(rows: dict[str, list]) -> dict:
    import pyarrow as pa

    return {"input_ids": pa.array(rows["input_ids"], type=pa.list_(pa.int32())),
            "loss_mask": pa.array(rows["loss_mask"], type=pa.list_(pa.int8())),
            "length": pa.array(rows["length"], type=pa.int32())}


def prepare(*, target: str | Path, input_path: str | Path, output: str | Path, block_size: int = 16,
            max_length: int | None = None, overlong: str = "truncate", heldout: float = 0.01,
            force: bool = False) -> PrepareReport:
    """Tokenize JSONL chat records with the target's tokenizer and chat template into an Arrow dataset,
    streaming: neither the records nor the tokens are ever all in memory. Records that carry
    `completion_token_ids` (written by `generate`) keep the target's exact answer tokens. A `heldout` share of
    the samples (by a hash of each chat: deterministic) goes to {output}/heldout instead, never trained on.
    The dataset is written beside `output` and moved there whole; a dataset already there is replaced only
    with `force`."""
    import datasets

    input_path, output = Path(input_path), Path(output)
    if not input_path.is_file():
        raise TrainerError(f"input {input_path} does not exist")
    if not 0 <= heldout < 1:
        raise TrainerError(f"the held-out share must be in [0, 1), got {heldout}")
    _refuse_to_overwrite(output, force=force)
    tokenizer = _target_tokenizer(Path(target))
    report = PrepareReport()
    staging = output.parent / f".{output.name}.staging-{os.getpid()}"
    with about_path(output, "write the dataset to"):  # under a file, or where nothing can be made
        staging.mkdir(parents=True)
    try:
        _write_streams(tokenizer, input_path, staging, report, block_size=block_size, max_length=max_length,
                       overlong=overlong, heldout=heldout)
        _refuse_an_empty_dataset(input_path, report)
        dataset = staging / "dataset"
        datasets.Dataset.from_file(str(staging / "train.arrow")).save_to_disk(str(dataset))
        if report.set_aside:
            datasets.Dataset.from_file(str(staging / "heldout.arrow")).save_to_disk(str(dataset / HELDOUT_DIR))
        _move_into_place(dataset, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _write_streams(tokenizer, input_path: Path, staging: Path, report: PrepareReport, **options) -> None:
    """The tokenized samples as two Arrow streams in `staging`: train.arrow and heldout.arrow."""
    import pyarrow as pa

    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                        ("length", pa.int32())])
    with (pa.OSFile(str(staging / "train.arrow"), "wb") as train_sink, pa.ipc.new_stream(train_sink, schema) as train,
          pa.OSFile(str(staging / "heldout.arrow"), "wb") as held_sink, pa.ipc.new_stream(held_sink, schema) as held):
        writers = {"train": train, "heldout": held}
        block_size = options.pop("block_size")
        for side, batch in _tokenized_batches(tokenizer, input_path, report, min_supervised=2 * block_size,
                                              **options):
            writers[side].write_batch(batch)


def _refuse_to_overwrite(output: Path, *, force: bool) -> None:
    """OUTPUT may be new, an empty directory, or (with --force) a dataset an earlier prepare wrote; never a file
    or a directory of something else, which --force would destroy."""
    if not output.exists():
        return
    if not output.is_dir():
        raise TrainerError(f"--output {output} exists and is not a directory: give a new directory for the dataset")
    if not any(output.iterdir()):
        return
    if not (output / DATASET_MARKER).is_file():
        raise TrainerError(f"--output {output} is a directory that holds something other than a dataset: give a "
                           "new or empty directory")
    if not force:
        raise TrainerError(f"--output {output} holds a dataset already (--force replaces it)")


def _move_into_place(dataset: Path, output: Path) -> None:
    """The finished dataset to `output`: renamed there, or swapped with the dataset it replaces."""
    with about_path(output, "write the dataset to"):
        if output.exists() and any(output.iterdir()):
            old = dataset.parent / "replaced"
            os.rename(output, old)
            os.rename(dataset, output)
        else:
            os.replace(dataset, output)  # over an empty directory too


def _target_tokenizer(target: Path):
    """The target's tokenizer, refused in one line (as generate, check and eval refuse it) when the directory is
    not a supported model or the tokenizer has no chat template to render the records with."""
    from transformers import AutoTokenizer

    from trainer.model.target import check_target_dir

    check_target_dir(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(target))
    except (OSError, ValueError) as exc:
        raise TrainerError(f"cannot load the tokenizer of {target}: {str(exc).splitlines()[0]}") from None
    if not tokenizer.chat_template:
        raise TrainerError(f"{target}: the tokenizer has no chat template (a base model?): prepare renders each "
                           "chat with the target's template; use the chat (instruct) model's directory")
    return tokenizer


def _refuse_an_empty_dataset(input_path: Path, report: PrepareReport) -> None:
    """A dataset of no sample is a mistake upstream (an empty file, every chat too short): say which, write none."""
    if report.records == 0:
        raise TrainerError(f"input {input_path} has no records (one JSON chat per line); nothing written")
    if report.kept == 0:
        raise TrainerError(
            f"input {input_path}: none of its {report.records} records is left to train on "
            f"({report.too_few_supervised} with fewer than 2*block_size supervised tokens, "
            f"{report.overlong_dropped} over-long dropped, {report.set_aside} held out); nothing written")
