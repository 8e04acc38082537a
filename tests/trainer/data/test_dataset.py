"""Data: lazy Arrow dataset, length buckets with a token budget, deterministic shuffled plans sharded across
ranks, a resumable stream that never repeats a sample inside an epoch, and `prepare`'s chat tokenization."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer.data.batches import BatchStream, layout_buckets, open_dataset, plan_epoch, rank_batches
from trainer.data.prepare import prepare, tokenize_chat
from trainer.errors import TrainerError

BOUNDS = [0, 16, 32, 64]


def write_dataset(path: Path, lengths: list[int], *, columns=("input_ids", "loss_mask")) -> Path:
    import datasets

    rng = np.random.default_rng(0)
    data = {}
    if "input_ids" in columns:
        data["input_ids"] = [rng.integers(1, 100, n).tolist() for n in lengths]
    if "loss_mask" in columns:
        data["loss_mask"] = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    if not data:
        data["text"] = ["x"] * len(lengths)
    datasets.Dataset.from_dict(data).save_to_disk(str(path))
    return path


@pytest.fixture()
def lengths() -> np.ndarray:
    return np.random.default_rng(3).integers(2, 80, size=203)


def test_batch_size_follows_the_token_budget_of_each_bucket(lengths):
    layout = layout_buckets(lengths, bounds=BOUNDS, token_budget=126, max_length=63, overlong="truncate")
    assert layout.batch_sizes == [126 // 15, 126 // 31, 126 // 63]
    for bucket in range(3):
        members = layout.bucket_of == bucket
        clipped = np.minimum(lengths[members], 63)
        assert ((clipped >= BOUNDS[bucket]) & (clipped < BOUNDS[bucket + 1])).all()
    assert layout.n_overlong == int((lengths > 63).sum()) > 0


def test_overlong_samples_can_be_dropped(lengths):
    layout = layout_buckets(lengths, bounds=BOUNDS, token_budget=126, max_length=63, overlong="drop")
    assert (layout.bucket_of[lengths > 63] == -1).all()
    plan = plan_epoch(layout, seed=0, epoch=0, world_size=1)
    seen = np.concatenate(plan)
    assert not np.isin(seen, np.flatnonzero(lengths > 63)).any()


def test_plan_is_deterministic_per_seed_and_reshuffled_per_epoch(lengths):
    layout = layout_buckets(lengths, bounds=BOUNDS, token_budget=126, max_length=63, overlong="truncate")
    first = plan_epoch(layout, seed=7, epoch=0, world_size=1)
    again = plan_epoch(layout, seed=7, epoch=0, world_size=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == len(again)
    other_epoch = plan_epoch(layout, seed=7, epoch=1, world_size=1)
    other_seed = plan_epoch(layout, seed=8, epoch=0, world_size=1)
    assert not np.array_equal(np.concatenate(first), np.concatenate(other_epoch))
    assert not np.array_equal(np.concatenate(first), np.concatenate(other_seed))
    # one epoch covers every sample exactly once
    assert sorted(np.concatenate(first).tolist()) == list(range(len(lengths)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_equal_disjoint_shards(lengths, world_size):
    layout = layout_buckets(lengths, bounds=BOUNDS, token_budget=126, max_length=63, overlong="truncate")
    plan = plan_epoch(layout, seed=0, epoch=0, world_size=world_size)
    shards = [rank_batches(plan, rank=r, world_size=world_size) for r in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1
    seen = np.concatenate([np.concatenate(shard) for shard in shards])
    assert len(seen) == len(set(seen.tolist()))
    assert sum(layout.batch_counts()) - len(plan) < world_size  # only the remainder batches are left out


def _stream(dataset, layout, **overrides):
    options = dict(seed=5, rank=0, world_size=1, max_length=63, pad_to_bucket=False, pad_token_id=0,
                   num_workers=2, prefetch=3, pin_memory=False)
    options.update(overrides)
    return BatchStream(dataset, layout, **options)


def _sample_ids(batch, dataset) -> list[tuple]:
    rows = batch.input_ids.numpy()
    return [tuple(row[:length]) for row, length in zip(rows, batch.attention_mask.sum(1).tolist())]


def test_stream_resumed_from_its_position_sees_no_sample_twice(tmp_path, lengths):
    dataset = open_dataset(write_dataset(tmp_path / "ds", lengths.tolist()))
    layout = layout_buckets(dataset.lengths, bounds=BOUNDS, token_budget=126, max_length=63, overlong="truncate")
    per_epoch = sum(layout.batch_counts())
    whole = _stream(dataset, layout)
    reference = [next(whole) for _ in range(per_epoch)]
    whole.close()

    first = _stream(dataset, layout)
    before = [next(first) for _ in range(7)]
    position = first.position()
    first.close()
    assert position == {"epoch": 0, "index": 7}
    second = _stream(dataset, layout, start_epoch=position["epoch"], start_index=position["index"])
    after = [next(second) for _ in range(per_epoch - 7)]
    following = next(second)
    second.close()

    resumed = before + after
    assert [b.index for b in resumed] == list(range(per_epoch))
    for ours, theirs in zip(resumed, reference):
        assert np.array_equal(ours.input_ids.numpy(), theirs.input_ids.numpy())
    rows = [row for batch in resumed for row in _sample_ids(batch, dataset)]
    assert len(rows) == len(dataset) == len(set(rows))
    assert following.epoch == 1 and following.index == 0


def test_batches_are_padded_and_masked(tmp_path, lengths):
    dataset = open_dataset(write_dataset(tmp_path / "ds", lengths.tolist()))
    layout = layout_buckets(dataset.lengths, bounds=BOUNDS, token_budget=126, max_length=63, overlong="truncate")
    batch = next(_stream(dataset, layout, pad_to_bucket=True))
    bucket = layout.bucket_of[np.flatnonzero(layout.bucket_of >= 0)][0]
    assert batch.input_ids.shape[1] in {b - 1 for b in BOUNDS[1:]}
    real = batch.attention_mask.bool()
    assert not batch.loss_mask[~real].any()
    assert int(real.sum()) == batch.n_tokens
    assert bucket >= 0
    loose = next(_stream(dataset, layout))
    assert loose.input_ids.shape[1] == int(loose.attention_mask.sum(1).max())


def test_bad_datasets_are_clear_errors(tmp_path):
    with pytest.raises(TrainerError, match="does not exist"):
        open_dataset(tmp_path / "missing")
    with pytest.raises(TrainerError, match="lacks the column"):
        open_dataset(write_dataset(tmp_path / "no_mask", [5, 6], columns=("input_ids",)))
    with pytest.raises(TrainerError, match="empty"):
        open_dataset(write_dataset(tmp_path / "empty", []))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("not arrow")
    with pytest.raises(TrainerError, match="not a saved Arrow dataset"):
        open_dataset(tmp_path / "junk")


def test_dataset_is_memory_mapped(tmp_path):
    import pyarrow as pa

    path = write_dataset(tmp_path / "ds", [4000] * 100)  # 400K tokens, 3.2 MB as int64 on disk
    before = pa.total_allocated_bytes()
    dataset = open_dataset(path)
    assert pa.total_allocated_bytes() - before < 64 * 1024  # the tokens stay in the mapped file
    ids, mask = dataset.rows(np.array([3, 1]))
    assert len(ids[0]) == 4000 and len(mask[1]) == 4000 and len(dataset) == 100


# --------------------------------------------------------------------------- prepare

def test_loss_mask_covers_exactly_the_assistant_turns(tiny_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 1 + 2?"},
                {"role": "assistant", "content": "It is 3!"}, {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hello, user."}]
    ids, mask = tokenize_chat(tokenizer, messages)
    assert ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)[
        "input_ids"]
    supervised = "".join(tokenizer.decode([t]) for t, m in zip(ids, mask) if m)
    assert supervised == "It is 3!<|im_end|>Hello, user.<|im_end|>"


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_prepare_counts_short_and_overlong_samples(tiny_target, tmp_path):
    long_answer = " ".join(["lorem ipsum dolor"] * 40)
    records = [
        {"prompt": "say something", "completion": long_answer},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]},
        {"prompt": "again", "completion": long_answer + " " + long_answer},
        # one that fits: dropping the over-long ones must leave something to train on (else prepare refuses)
        {"prompt": "briefly", "completion": " ".join(["lorem ipsum dolor"] * 8)},
    ]
    source = _write_jsonl(tmp_path / "in.jsonl", records)
    report = prepare(target=tiny_target, input_path=source, output=tmp_path / "ds", block_size=4, max_length=200)
    assert (report.records, report.kept, report.too_few_supervised) == (4, 3, 1)
    assert report.overlong_truncated >= 1
    dataset = open_dataset(tmp_path / "ds")
    assert len(dataset) == 3 and dataset.lengths.max() <= 200

    dropped = prepare(target=tiny_target, input_path=source, output=tmp_path / "ds2", block_size=4,
                      max_length=200, overlong="drop")
    assert dropped.overlong_dropped == report.overlong_truncated
    assert dropped.kept == report.kept - report.overlong_truncated


def test_prepare_names_the_bad_line(tiny_target, tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n{not json\n")
    with pytest.raises(TrainerError, match=r"bad.jsonl:2: invalid JSON"):
        prepare(target=tiny_target, input_path=source, output=tmp_path / "ds")
    source.write_text(json.dumps({"text": "no chat here"}) + "\n")
    with pytest.raises(TrainerError, match=r"bad.jsonl:1: expected"):
        prepare(target=tiny_target, input_path=source, output=tmp_path / "ds")
