"""Regenerate the assistant turns of a prompt set with the target itself (greedy), as the DFlash recipe does:
the drafter then learns the target's own continuations, which is what it must predict at inference."""
from __future__ import annotations

import json
from pathlib import Path

from trainer.prepare import record_messages
from trainer.errors import TrainerError


def read_prompts(path: str | Path) -> list[list[dict[str, str]]]:
    """Prompt chats from JSONL: {"messages": [...]} (trailing assistant turns are dropped) or {"prompt": ...}."""
    path = Path(path)
    if not path.is_file():
        raise TrainerError(f"prompts file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrainerError(f"{where}: invalid JSON: {exc.msg}") from None
        if isinstance(record, dict) and "prompt" in record and "completion" not in record:
            record = {**record, "completion": ""}
        messages = record_messages(record, where=where)
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages:
            raise TrainerError(f"{where}: no prompt left once the assistant turns are removed")
        prompts.append(messages)
    if not prompts:
        raise TrainerError(f"prompts file {path} has no records")
    return prompts


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

    from trainer.target import check_target_dir, refuse_fla_off_gpu

    refuse_fla_off_gpu(check_target_dir(Path(target)), device)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    dtype = pick_dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype).to(device).eval()
    return model, tokenizer


def generate(*, target: str | Path, prompts: str | Path, output: str | Path, max_new_tokens: int = 512,
             batch_size: int = 16, device: str = "auto") -> int:
    """Write one chat record per prompt with the target's greedy answer appended; returns the record count."""
    chats = read_prompts(prompts)
    torch_device = pick_device(device)
    model, tokenizer = load_target_for_generation(target, torch_device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as sink:
        for start in range(0, len(chats), batch_size):
            batch = chats[start:start + batch_size]
            for messages, (answer, answer_ids) in zip(batch, _answer_batch(model, tokenizer, batch,
                                                                           max_new_tokens)):
                # the ids keep the target's exact tokens: decoded text need not re-tokenize to the same ones
                record = {"messages": [*messages, {"role": "assistant", "content": answer}],
                          "completion_token_ids": answer_ids}
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(chats)


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
