"""Training data: the tokenized Arrow dataset (memory-mapped, never loaded whole), length buckets with a token
budget per batch, a per-epoch shuffled and rank-sharded batch plan, and a prefetching batch stream whose
position (epoch, batch index) is saved in checkpoints so a resumed run sees no sample twice in an epoch.
"""
from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.errors import TrainerError

REQUIRED_COLUMNS = ("input_ids", "loss_mask")


@dataclass
class TokenDataset:
    """A memory-mapped Arrow table of tokenized samples; rows are read only when a batch needs them."""

    path: str
    table: object  # pyarrow.Table backed by memory-mapped files
    lengths: np.ndarray  # tokens per sample, from the list offsets (the token data itself is not read)

    def __len__(self) -> int:
        return len(self.lengths)

    def rows(self, indices: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        taken = self.table.select(list(REQUIRED_COLUMNS)).take(indices)
        ids = _split_lists(taken.column("input_ids"))
        mask = _split_lists(taken.column("loss_mask"))
        return ids, mask


def _split_lists(column) -> list[np.ndarray]:
    array = column.combine_chunks()
    values = array.flatten().to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy() - array.offsets[0].as_py()
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(array))]


def open_dataset(path: str | Path) -> TokenDataset:
    """Open a `prepare`d (datasets.save_to_disk) dataset lazily; bad or empty datasets are a TrainerError."""
    import pyarrow.compute as pc

    path = Path(path)
    if not path.is_dir():
        raise TrainerError(f"dataset {path} does not exist or is not a directory (run `python -m trainer prepare`)")
    import datasets

    if _saved_shards(path) == 0:  # datasets cannot even open a saved dataset without rows
        raise TrainerError(f"dataset {path} is empty")
    try:
        dataset = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, IndexError, KeyError) as exc:
        raise TrainerError(f"dataset {path} is not a saved Arrow dataset: {exc}") from None
    if isinstance(dataset, datasets.DatasetDict):
        raise TrainerError(f"dataset {path} has several splits ({', '.join(dataset)}); give one split's directory")
    missing = [name for name in REQUIRED_COLUMNS if name not in dataset.column_names]
    if missing:
        raise TrainerError(f"dataset {path} lacks the column(s) {', '.join(missing)} "
                           f"(has: {', '.join(dataset.column_names) or 'none'}); make it with `python -m trainer prepare`")
    if len(dataset) == 0:
        raise TrainerError(f"dataset {path} is empty")
    table = dataset.data.table
    if dataset._indices is not None:  # a saved selection: apply it once, as datasets itself would on access
        table = table.take(dataset._indices.column(0))
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    return TokenDataset(path=str(path), table=table, lengths=lengths)


def _saved_shards(path: Path) -> int | None:
    import json

    try:
        return len(json.loads((path / "state.json").read_text())["_data_files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------- length buckets and the batch plan

@dataclass
class BucketLayout:
    bounds: list[int]  # boundaries; bucket b holds lengths in [bounds[b], bounds[b+1])
    batch_sizes: list[int]  # samples per batch of each bucket
    bucket_of: np.ndarray  # bucket per sample, -1 for samples dropped as over-long
    n_overlong: int

    def batch_counts(self) -> list[int]:
        counts = np.bincount(self.bucket_of[self.bucket_of >= 0], minlength=len(self.batch_sizes))
        return [int(-(-n // size)) for n, size in zip(counts, self.batch_sizes)]

    def batch_size_stats(self) -> tuple[int, int, float]:
        """(min, max, average) samples per batch over one epoch's batches."""
        counts = np.bincount(self.bucket_of[self.bucket_of >= 0], minlength=len(self.batch_sizes))
        sizes = []
        for n, size in zip(counts.tolist(), self.batch_sizes):
            sizes += [size] * (n // size) + ([n % size] if n % size else [])
        n_batches = max(1, len(sizes))
        return (min(sizes, default=0), max(sizes, default=0), sum(sizes) / n_batches)


def layout_buckets(lengths: np.ndarray, *, bounds: list[int], token_budget: int, max_length: int,
                   overlong: str) -> BucketLayout:
    """Assign samples to buckets; a batch of bucket [lo, hi) holds floor(budget / (hi - 1)) samples (hi is
    exclusive, so hi - 1 is the longest sample it can hold)."""
    effective = np.minimum(lengths, max_length)
    bucket_of = np.searchsorted(np.asarray(bounds), effective, side="right") - 1
    is_overlong = lengths > max_length
    if overlong == "drop":
        bucket_of = np.where(is_overlong, -1, bucket_of)
    batch_sizes = [max(1, token_budget // max(1, hi - 1)) for hi in bounds[1:]]
    return BucketLayout(bounds=list(bounds), batch_sizes=batch_sizes, bucket_of=bucket_of.astype(np.int64),
                        n_overlong=int(is_overlong.sum()))


def plan_epoch(layout: BucketLayout, *, seed: int, epoch: int, world_size: int) -> list[np.ndarray]:
    """All ranks' batches of one epoch, shuffled by (seed, epoch) and cut to a multiple of world_size so every
    rank gets the same number; rank r takes batches r, r + world_size, ..."""
    rng = np.random.default_rng([seed, epoch])
    batches: list[np.ndarray] = []
    for bucket, size in enumerate(layout.batch_sizes):
        members = np.flatnonzero(layout.bucket_of == bucket)
        rng.shuffle(members)
        batches += [members[i:i + size] for i in range(0, len(members), size)]
    order = rng.permutation(len(batches))
    usable = len(batches) // world_size * world_size
    return [batches[i] for i in order[:usable]]


def rank_batches(plan: list[np.ndarray], *, rank: int, world_size: int) -> list[np.ndarray]:
    return plan[rank::world_size]


def batches_per_rank(layout: BucketLayout, *, world_size: int) -> int:
    return sum(layout.batch_counts()) // world_size


# --------------------------------------------------------------------------- batches

@dataclass
class Batch:
    input_ids: object  # torch.LongTensor [B, S]
    loss_mask: object  # torch.BoolTensor [B, S]
    attention_mask: object  # torch.LongTensor [B, S], 1 on real tokens
    n_tokens: int  # real (unpadded) tokens
    epoch: int
    index: int  # batch index inside this rank's epoch


def collate(dataset: TokenDataset, indices: np.ndarray, *, max_length: int, pad_to: int | None,
            pad_token_id: int, pin_memory: bool):
    """Right-padded tensors of the samples, truncated to max_length, padded to `pad_to` or the batch max."""
    import torch

    ids, mask = dataset.rows(indices)
    ids = [row[:max_length] for row in ids]
    mask = [row[:max_length] for row in mask]
    width = pad_to or max(len(row) for row in ids)
    input_ids = np.full((len(ids), width), pad_token_id, dtype=np.int64)
    loss_mask = np.zeros((len(ids), width), dtype=np.bool_)
    attention = np.zeros((len(ids), width), dtype=np.int64)
    for i, (row_ids, row_mask) in enumerate(zip(ids, mask)):
        input_ids[i, :len(row_ids)] = row_ids
        loss_mask[i, :len(row_mask)] = row_mask.astype(np.bool_)
        attention[i, :len(row_ids)] = 1
    tensors = [torch.from_numpy(array) for array in (input_ids, loss_mask, attention)]
    if pin_memory:
        tensors = [tensor.pin_memory() for tensor in tensors]
    return tensors, int(attention.sum())


class BatchStream:
    """This rank's batches from a data position on, over epochs without end, built ahead by CPU threads.

    Threads only slice Arrow rows into (pinned) CPU tensors; every GPU operation stays on the main thread.
    Batches come out in plan order whatever the thread count, so a run is deterministic per seed.
    """

    def __init__(self, dataset: TokenDataset, layout: BucketLayout, *, seed: int, rank: int, world_size: int,
                 start_epoch: int = 0, start_index: int = 0, max_length: int, pad_to_bucket: bool,
                 pad_token_id: int, num_workers: int, prefetch: int, pin_memory: bool):
        self.dataset, self.layout = dataset, layout
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.collate_options = dict(max_length=max_length, pad_token_id=pad_token_id, pin_memory=pin_memory)
        self.pad_to_bucket = pad_to_bucket
        self.prefetch = prefetch
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="batch-builder")
        self.pending: collections.deque[tuple[int, int, Future]] = collections.deque()
        self.epoch, self.index = start_epoch, start_index  # next batch to hand out
        self._plan_epoch, self._plan = -1, []
        self._next_epoch, self._next_index = start_epoch, start_index  # next batch to submit

    def batches_per_epoch(self) -> int:
        return batches_per_rank(self.layout, world_size=self.world_size)

    def _rank_plan(self, epoch: int) -> list[np.ndarray]:
        if epoch != self._plan_epoch:
            plan = plan_epoch(self.layout, seed=self.seed, epoch=epoch, world_size=self.world_size)
            self._plan_epoch, self._plan = epoch, rank_batches(plan, rank=self.rank, world_size=self.world_size)
        return self._plan

    def _pad_width(self, indices: np.ndarray) -> int | None:
        if not self.pad_to_bucket:
            return None
        bucket = int(self.layout.bucket_of[indices[0]])
        return min(self.layout.bounds[bucket + 1] - 1, self.collate_options["max_length"])

    def _submit_next(self) -> None:
        plan = self._rank_plan(self._next_epoch)
        if self._next_index >= len(plan):
            self._next_epoch, self._next_index = self._next_epoch + 1, 0
            plan = self._rank_plan(self._next_epoch)
        indices = plan[self._next_index]
        future = self.pool.submit(collate, self.dataset, indices, pad_to=self._pad_width(indices),
                                  **self.collate_options)
        self.pending.append((self._next_epoch, self._next_index, future))
        self._next_index += 1

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        while len(self.pending) < self.prefetch:
            self._submit_next()
        epoch, index, future = self.pending.popleft()
        (input_ids, loss_mask, attention), n_tokens = future.result()
        self.epoch, self.index = (epoch, index + 1)
        return Batch(input_ids, loss_mask, attention, n_tokens, epoch, index)

    def queue_depth(self) -> int:
        """Batches built and waiting (the q_pre of the step line)."""
        return sum(1 for _, _, future in self.pending if future.done())

    def position(self) -> dict[str, int]:
        """Where a resumed run must continue: the batch after the last one handed out."""
        return {"epoch": self.epoch, "index": self.index}

    def close(self) -> None:
        for _, _, future in self.pending:
            future.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
