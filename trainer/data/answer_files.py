"""The files of `generate`: prompts streamed from JSONL, the answers file it appends to (and resumes from), and
the `.failed.jsonl` beside it. Torch-free.

The answers file holds one chat record per line, each with its prompt's `index` (the prompt's place among the
prompts file's non-blank lines, from 0), in the order answers finished. A rerun reads the indices already there
and skips them; a last line cut off by a kill (no newline, or no valid JSON) is cut away and its prompt redone.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainer.data.prepare import record_messages
from trainer.errors import TrainerError, about_path

Chat = list[dict[str, str]]


@dataclass(frozen=True)
class Prompt:
    index: int
    messages: Chat | None  # None when the line is not a usable prompt; `problem` says why
    problem: str | None = None


def count_prompts(path: Path) -> int:
    """Non-blank lines, read in chunks: the total for progress without holding the file."""
    if not path.is_file():
        raise TrainerError(f"prompts file {path} does not exist")
    count = 0
    with path.open("rb") as lines:
        for line in lines:
            count += bool(line.strip())
    if not count:
        raise TrainerError(f"prompts file {path} has no records")
    return count


def iter_prompts(path: Path, *, skip: set[int] | frozenset[int] = frozenset()) -> Iterator[Prompt]:
    """Prompt chats from JSONL, one at a time: {"messages": [...]} (trailing assistant turns are dropped) or
    {"prompt": ...}. A bad line becomes a Prompt with a problem (a permanent failure), not an error that would
    end a run of a million prompts at its 600,000th; prompts whose index is in `skip` are not parsed at all."""
    index = -1
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            index += 1
            if index not in skip:
                yield _prompt(index, line, f"{path}:{number}")


def _prompt(index: int, line: str, where: str) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return Prompt(index, None, f"{where}: invalid JSON: {exc.msg}")
    if isinstance(record, dict) and "prompt" in record and "completion" not in record:
        record = {**record, "completion": ""}
    try:
        messages = record_messages(record, where=where)
    except TrainerError as exc:
        return Prompt(index, None, str(exc))
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        return Prompt(index, None, f"{where}: no prompt left once the assistant turns are removed")
    return Prompt(index, messages)


def failed_path(output: Path) -> Path:
    return output.with_name(output.name.removesuffix(".jsonl") + ".failed.jsonl")


@dataclass
class Resumed:
    answered: set[int]
    torn: bool  # a cut-off last line was removed


def resume_output(output: Path) -> Resumed:
    """Read the indices already answered in `output`, cutting away a torn last line (the file is truncated to
    its last complete record, so appending continues cleanly). A missing file is an empty one."""
    answered: set[int] = set()
    if not output.exists():
        return Resumed(answered, False)
    if not output.is_file():
        kind = "a directory" if output.is_dir() else "not a regular file"
        raise TrainerError(f"--output {output} is {kind}: give the JSONL file to append the answers to, e.g. "
                           f"{output / 'answers.jsonl'}")
    good_end = 0
    with output.open("rb") as lines:
        previous: bytes | None = None
        for number, line in enumerate(lines, 1):
            if previous is not None:  # a bad line with more after it is not a torn end: not our file
                raise TrainerError(f"{output}:{number - 1}: not a generated record (no 'index'); "
                                   "refusing to append to it")
            index = _record_index(line) if line.endswith(b"\n") else None
            if index is None and line.strip():
                if line.endswith(b"\n") and _is_json(line):  # whole, but not generate's
                    raise TrainerError(f"{output}:{number}: a record without an 'index' (not written by this "
                                       "generate); refusing to append to it")
                previous = line
                continue
            if index is not None:
                answered.add(index)
            good_end += len(line)
        torn = previous is not None
    if torn:
        with output.open("r+b") as sink:
            sink.truncate(good_end)
    return Resumed(answered, torn)


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _record_index(line: bytes) -> int | None:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    index = record.get("index") if isinstance(record, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else None


class AnswerFiles:
    """Appends records to the answers file and failures to the failed file, one whole line per write, flushed
    at once: a kill loses at most the line being written, which the next run's resume cuts away."""

    def __init__(self, output: Path) -> None:
        with about_path(output, "write the answers to"):  # under a file, or where nothing can be made
            output.parent.mkdir(parents=True, exist_ok=True)
            self._answers = output.open("a", encoding="utf-8")
        with about_path(failed_path(output), "write the failed prompts to"):
            # this run's permanent failures only: a rerun retries them, and those it answers are answered
            self._failed = failed_path(output).open("w", encoding="utf-8")

    def answered(self, index: int, messages: Chat, answer: str, token_ids: list[int] | None,
                 **extra: object) -> None:
        record: dict[str, object] = {"index": index, "messages": [*messages, {"role": "assistant",
                                                                               "content": answer}]}
        if token_ids is not None:
            # the ids keep the target's exact tokens: decoded text need not re-tokenize to the same ones
            record["completion_token_ids"] = token_ids
        record.update(extra)
        self._write(self._answers, record)

    def failed(self, index: int, reason: str) -> None:
        self._write(self._failed, {"index": index, "reason": reason})

    @staticmethod
    def _write(sink, record: dict) -> None:
        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        sink.flush()

    def close(self) -> None:
        self._answers.close()
        self._failed.close()
