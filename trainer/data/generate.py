"""Regenerate the assistant turns of a prompt set with the target itself (greedy), as the DFlash recipe does:
the drafter then learns the target's own continuations, which is what it must predict at inference.

Two ways to answer: the target loaded here with Hugging Face `generate` in batches (small jobs, CPU tests), or
an inference engine serving it behind an OpenAI-compatible API (`server=`; trainer/data/chat_client.py). Both stream
the prompts, append each answer as it finishes, resume from the answers already written (trainer/data/answer_files.py),
print progress lines on stderr and end with one summary.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer import logformat
from trainer.data.answer_files import AnswerFiles, Prompt, count_prompts, failed_path, iter_prompts, resume_output
from trainer.data.chat_client import Answer, PermanentFailure

SUMMARY_VERSION = 1


@dataclass
class GenerateSummary:
    prompts: int  # in the prompts file
    answered: int  # by this run
    skipped: int  # answered by an earlier run
    failed: int
    tokens: int  # answer tokens of this run
    seconds: float
    torn_line_redone: bool
    output: str
    failed_file: str

    def line(self) -> str:
        return (f"generated {self.answered} of {self.prompts} prompts, {self.tokens} tokens in "
                f"{self.seconds:.1f}s; skipped {self.skipped} already answered, failed {self.failed}"
                + (f" (see {self.failed_file})" if self.failed else "") + f" -> {self.output}")

    def as_json(self) -> str:
        return json.dumps({"v": SUMMARY_VERSION, **asdict(self)})


def read_prompts(path: str | Path) -> list[list[dict[str, str]]]:
    """Every prompt chat of a small file (eval's few prompts): a bad line is an error here, not a failure."""
    from trainer.errors import TrainerError

    path = Path(path)
    count_prompts(path)
    chats = []
    for prompt in iter_prompts(path):
        if prompt.messages is None:
            raise TrainerError(prompt.problem)
        chats.append(prompt.messages)
    return chats


def pick_device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]


def load_target_for_generation(target: str | Path, device, dtype: str = "auto"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.model.target import check_target_dir, refuse_fla_off_gpu

    refuse_fla_off_gpu(check_target_dir(Path(target)), device)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    dtype = pick_dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype).to(device).eval()
    return model, tokenizer


def generate(*, target: str | Path | None, prompts: str | Path, output: str | Path, max_new_tokens: int = 512,
             batch_size: int = 16, device: str = "auto", server: str | None = None, model: str | None = None,
             concurrency: int = 8, retries: int = 6, retry_wait_s: float = 1.0, request_timeout_s: float | None = None,
             progress_every_s: float = 10.0, say=None) -> GenerateSummary:
    """Answer every prompt not yet in `output` and append one chat record per answer (with its `index`);
    prompts that fail for good go to the `.failed.jsonl` beside it."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    prompts, output = Path(prompts), Path(output)
    total = count_prompts(prompts)
    resumed = resume_output(output)
    files = AnswerFiles(output)  # an output it cannot write is refused before a model loads or a server is asked
    try:
        answer_all = _answerer(target=target, server=server, model=model, concurrency=concurrency,
                               max_new_tokens=max_new_tokens, retries=retries, retry_wait_s=retry_wait_s,
                               request_timeout_s=request_timeout_s, device=device, batch_size=batch_size, say=say,
                               left=len(resumed.answered) < total)
        if resumed.torn:
            say(f"{output}: its last line was cut off (a killed run); that prompt is asked again")
        if resumed.answered:
            say(f"{output}: skipping {len(resumed.answered)} prompts already answered")
        progress = Progress(total=total, skipped=len(resumed.answered), every_s=progress_every_s, say=say)
        _answer_into(files, answer_all, iter_prompts(prompts, skip=resumed.answered), progress)
    finally:
        files.close()
    progress.report()
    return GenerateSummary(prompts=total, answered=progress.answered, skipped=progress.skipped,
                           failed=progress.failed, tokens=progress.tokens, seconds=round(progress.seconds(), 3),
                           torn_line_redone=resumed.torn, output=str(output), failed_file=str(failed_path(output)))


def _answerer(*, target, server: str | None, model: str | None, concurrency: int, max_new_tokens: int,
              retries: int, retry_wait_s: float, request_timeout_s: float | None, device: str, batch_size: int,
              say, left: bool):
    """What answers the prompts: the server's client, the target loaded here, or nothing (all answered)."""
    if server is not None:
        from trainer.data.chat_client import ServerClient

        client = ServerClient(server, model=model, concurrency=concurrency, max_new_tokens=max_new_tokens,
                              retries=retries, retry_wait_s=retry_wait_s, timeout_s=request_timeout_s)
        say(f"Generating with model {client.model!r} of {client.base} ({client.concurrency} at a time)")
        return client.answer_all
    if left:
        return LocalTarget(target, device=device, max_new_tokens=max_new_tokens, say=say,
                           batch_size=batch_size).answer_all
    return _nothing_left


def _answer_into(files: AnswerFiles, answer_all, stream: Iterator[Prompt], progress: "Progress") -> None:
    chats: dict[int, list[dict[str, str]]] = {}  # the prompts in flight, to write them beside their answers

    def askable():
        for prompt in stream:
            if prompt.messages is None:
                files.failed(prompt.index, prompt.problem or "not a prompt")
                progress.failed_one()
                continue
            chats[prompt.index] = prompt.messages
            yield prompt.index, prompt.messages

    for index, result in answer_all(askable()):
        messages = chats.pop(index)
        if isinstance(result, PermanentFailure):
            files.failed(index, str(result))
            progress.failed_one()
            continue
        extra = {"finish_reason": result.finish_reason} if result.finish_reason else {}
        files.answered(index, messages, result.text, result.token_ids, **extra)
        progress.answered_one(result.completion_tokens)


def _nothing_left(prompts) -> Iterator[tuple[int, Answer]]:
    for _ in prompts:  # only prompts that are no prompt at all can be left: they fail, nothing is asked
        pass
    return iter(())


class Progress:
    """Counts of this run and a progress line on stderr at most every `every_s` seconds (and at the end)."""

    def __init__(self, *, total: int, skipped: int, every_s: float, say) -> None:
        self.total, self.skipped, self.every_s, self.say = total, skipped, every_s, say
        self.answered = self.failed = self.tokens = 0
        self.started = time.monotonic()
        self._last_report = self.started

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def answered_one(self, tokens: int) -> None:
        self.answered += 1
        self.tokens += tokens
        self._maybe_report()

    def failed_one(self) -> None:
        self.failed += 1
        self._maybe_report()

    def _maybe_report(self) -> None:
        if time.monotonic() - self._last_report >= self.every_s:
            self.report()

    def report(self) -> None:
        self._last_report = time.monotonic()
        seconds = max(self.seconds(), 1e-9)
        rate = (self.answered + self.failed) / seconds
        left = self.total - self.skipped - self.answered - self.failed
        eta = left / rate if rate > 0 else (0.0 if left == 0 else None)
        self.say(logformat.format_generate_line(seconds, answered=self.skipped + self.answered, total=self.total,
                                                failed=self.failed, tok_per_s=self.tokens / seconds,
                                                prompts_per_s=self.answered / seconds, eta_s=eta))


class LocalTarget:
    """The target loaded here, answering batches of prompts with Hugging Face `generate` (greedy)."""

    def __init__(self, target, *, device: str, max_new_tokens: int, batch_size: int, say=print) -> None:
        from trainer.errors import TrainerError

        if target is None:
            raise TrainerError("generate needs --target (to load it here) or --server (to ask an engine)")
        from trainer.model.cpu_threads import one_thread_for_a_small_model

        torch_device = pick_device(device)
        self.model, self.tokenizer = load_target_for_generation(target, torch_device)
        one_thread_for_a_small_model(self.model.config.hidden_size, torch_device, say, command="generate")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_new_tokens, self.batch_size = max_new_tokens, max(1, batch_size)

    def answer_all(self, prompts) -> Iterator[tuple[int, Answer]]:
        batch: list[tuple[int, list[dict[str, str]]]] = []
        for item in prompts:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield from self._answer(batch)
                batch = []
        if batch:
            yield from self._answer(batch)

    def _answer(self, batch) -> Iterator[tuple[int, Answer]]:
        answers = _answer_batch(self.model, self.tokenizer, [m for _, m in batch], self.max_new_tokens)
        for (index, _), (text, ids) in zip(batch, answers):
            finish = "length" if len(ids) >= self.max_new_tokens else "stop"
            yield index, Answer(text, ids, len(ids), finish)


def _answer_batch(model, tokenizer, batch: list[list[dict[str, str]]],
                  max_new_tokens: int) -> list[tuple[str, list[int]]]:
    import torch

    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch]
    # left padding: every prompt ends where generation starts
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    encoded = {key: value.to(model.device) for key, value in encoded.items()}
    with torch.no_grad():
        generated = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    answers = []
    for row in generated[:, encoded["input_ids"].shape[1]:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[:row.index(tokenizer.eos_token_id)]  # the chat template closes the turn itself
        answers.append((tokenizer.decode(row, skip_special_tokens=True), row))
    return answers
