"""The container's GPU queue on disk: SQLite (the standard library's), in WAL mode, one writer at a time.

`{runs_dir}/.queue/queue.db` holds one row per queued run, in the order runs entered it (an INTEGER PRIMARY KEY
that only grows: first in, first out). Every write is one transaction begun with BEGIN IMMEDIATE, which takes
SQLite's one writer lock at once, so two agents enqueueing at the same moment get two distinct places, and a
crash mid-write leaves the queue as it was before. Readers (ps, queue) never wait for a writer (WAL).

A row keeps what the run's start needs beyond its run directory: the GPUs it waits for (named, or any
`gpu_count`), the check to run again when its turn comes (the trainer's check, with the input it reads), and
how long to wait for its start to be verified. Who adds, removes and starts rows: docs/design.md (the queue).
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3

BUSY_TIMEOUT_S = 30.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    queued_at TEXT NOT NULL,
    gpus TEXT,
    gpu_count INTEGER,
    check_argv TEXT,
    check_input TEXT,
    verify_timeout_s REAL
)
"""
COLUMNS = ("seq", "run_id", "queued_at", "gpus", "gpu_count", "check_argv", "check_input", "verify_timeout_s")


def queue_dir(runs_dir: str) -> str:
    return os.path.join(os.path.abspath(runs_dir), ".queue")


def db_path(runs_dir: str) -> str:
    return os.path.join(queue_dir(runs_dir), "queue.db")


def files(runs_dir: str) -> tuple:
    """The files a write to the queue changes (the database, its write-ahead log): what a watcher stamps."""
    return (db_path(runs_dir), db_path(runs_dir) + "-wal")


class Entry:
    """One queued run as its row keeps it: gpus None (every GPU, or any gpu_count of them), [] (none), or
    the indices it names."""

    def __init__(self, seq: int, run_id: str, queued_at: str, gpus: list | None, gpu_count: int | None,
                 check_argv: list | None = None, check_input: str | None = None,
                 verify_timeout_s: float | None = None) -> None:
        self.seq = seq
        self.run_id = run_id
        self.queued_at = queued_at
        self.gpus = gpus
        self.gpu_count = gpu_count
        self.check_argv = check_argv
        self.check_input = check_input
        self.verify_timeout_s = verify_timeout_s

    @classmethod
    def from_row(cls, row: tuple) -> Entry:
        values = dict(zip(COLUMNS, row))
        for key in ("gpus", "check_argv"):
            values[key] = json.loads(values[key]) if values[key] is not None else None
        return cls(**values)

    def __repr__(self) -> str:
        return "Entry({!r}, seq={}, gpus={!r}, gpu_count={!r})".format(self.run_id, self.seq, self.gpus,
                                                                      self.gpu_count)


def _connect(runs_dir: str, *, create: bool) -> sqlite3.Connection | None:
    path = db_path(runs_dir)
    if not create and not os.path.exists(path):
        return None
    os.makedirs(queue_dir(runs_dir), mode=0o700, exist_ok=True)
    # isolation_level None: no implicit transactions; every write below begins its own, IMMEDIATE
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # a committed place in the queue survives a power cut too
    conn.execute(SCHEMA)
    return conn


@contextlib.contextmanager
def _writing(runs_dir: str):
    """A connection inside one write transaction that holds the writer lock from its first statement."""
    conn = _connect(runs_dir, create=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


def enqueue(runs_dir: str, run_id: str, *, queued_at: str, gpus: list | None, gpu_count: int | None,
            check_argv: list | None = None, check_input: str | None = None,
            verify_timeout_s: float | None = None) -> int:
    """Add a run at the end of the queue; its position (1: next to start)."""
    with _writing(runs_dir) as conn:
        conn.execute("INSERT INTO queue (run_id, queued_at, gpus, gpu_count, check_argv, check_input, "
                     "verify_timeout_s) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (run_id, queued_at, None if gpus is None else json.dumps(gpus), gpu_count,
                      None if check_argv is None else json.dumps(check_argv), check_input, verify_timeout_s))
        return _position(conn, run_id) or 0


def remove(runs_dir: str, run_id: str) -> bool:
    """Take a run out of the queue (started, killed, or gone); whether it was there."""
    if not os.path.exists(db_path(runs_dir)):
        return False
    with _writing(runs_dir) as conn:
        return conn.execute("DELETE FROM queue WHERE run_id = ?", (run_id,)).rowcount > 0


def entries(runs_dir: str) -> list:
    """Every queued run, first in first."""
    conn = _connect(runs_dir, create=False)
    if conn is None:
        return []
    try:
        rows = conn.execute("SELECT {} FROM queue ORDER BY seq".format(", ".join(COLUMNS))).fetchall()
    finally:
        conn.close()
    return [Entry.from_row(row) for row in rows]


def positions(runs_dir: str) -> dict:
    """run id -> its place (1: next to start)."""
    return {entry.run_id: place for place, entry in enumerate(entries(runs_dir), 1)}


def has_entries(runs_dir: str) -> bool:
    conn = _connect(runs_dir, create=False)
    if conn is None:
        return False
    try:
        return conn.execute("SELECT 1 FROM queue LIMIT 1").fetchone() is not None
    finally:
        conn.close()


def _position(conn: sqlite3.Connection, run_id: str) -> int | None:
    row = conn.execute("SELECT seq FROM queue WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        return None
    return conn.execute("SELECT COUNT(*) FROM queue WHERE seq <= ?", (row[0],)).fetchone()[0]
