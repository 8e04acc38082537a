"""How many CPU threads torch uses for a small model: one.

A small target's operations on the CPU (the tiny random ones of the tests, the demo and the README's CPU
config) are too small to share out: torch's default of one thread per core only makes the threads spin and
wait for each other, and on a machine whose cores are busy with other work they wait much longer. Measured on 2
cores (bench/bench_threads.py; bench/RESULTS.md has the figures): generate, train and eval each ran several
times faster on one thread, and the gap grew under load. A model as wide as a real one (hidden size 1024 and
up) keeps torch's default. OMP_NUM_THREADS, when set, is the user's choice and always stands.
"""
from __future__ import annotations

import os

import torch

SMALL_HIDDEN = 1024


def one_thread_for_a_small_model(hidden_size: int, device: torch.device, say, *, command: str) -> None:
    """On the CPU, without OMP_NUM_THREADS, run a model narrower than SMALL_HIDDEN on one thread; say so."""
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ and hidden_size < SMALL_HIDDEN:
        torch.set_num_threads(1)
        say(f"{command}: one CPU thread (a target of hidden size {hidden_size}; set OMP_NUM_THREADS to choose)")
