"""Deterministic dashboard data: two hosts, four runs, GPUs and alerts, all at fixed times."""
from __future__ import annotations

import math

from dflash_records.gpu import GpuRow
from orchestrator.watch.model import AlertView, GpuView, HostView, MetricPoint, RunView, Snapshot

TAKEN_AT = "2026-12-01T12:00:00Z"
SEED_MEMORY_MIB = (88283, 96779, 88443, 96905, 76779, 46901, 48861, 47421)  # the stalled seed host
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/opt/dflash/trainer/train.py", line 212, in train_step\n'
    "    loss.backward()\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
)


def history(steps: int, *, every: int = 10) -> tuple[MetricPoint, ...]:
    return tuple(MetricPoint(step=step, loss=12.5 * math.exp(-step / 400) + 2.0, acc=0.6 * (1 - math.exp(-step / 300)),
                             streak=3.5 * (1 - math.exp(-step / 350)), tok_per_s=11_700 + 400 * math.sin(step / 50),
                             tau_replay=1 + 1.4 * (1 - math.exp(-step / 350)),
                             # evaluated every 100 steps: held-out τ trails the training batches' (overfitting)
                             tau_heldout=1 + 1.0 * (1 - math.exp(-step / 300)) if step % 100 == 0 else None,
                             # real speculative decoding of held-out prompts agrees with the held-out replay
                             tau_eval=1 + 0.95 * (1 - math.exp(-step / 300)) if step % 200 == 0 else None)
                 for step in range(every, steps + 1, every))


def step_line(step: int, loss: float) -> str:
    return (f"[{step // 20}m] step={step} loss={loss:.4f} acc=0.412 streak=2.1 lr=4.52e-06 noise=0.0003 | "
            f"tgt=0.34b/s dft=0.29b/s (11.7Ktok/s) | q_pre=[50, 50, 50, 49, 50] q_hs=[15] | epoch~0.01 ETA=12.0d")


def training_run() -> RunView:
    points = history(1200)
    return RunView(run_id="r-0001", target="pve1/200", name="qwen3-8b-drafter", state="running", phase="training",
                   pid=4100, created_at="2026-12-01T10:00:00Z", gpus=(0, 1), last_step=1200, loss=points[-1].loss,
                   acc=points[-1].acc, streak=points[-1].streak, lr=4.52e-06, tok_per_s=11_700.0, eta_s=12 * 86400.0,
                   q_pre=(50, 50, 50, 49, 50), q_hs=(15,), history=points, tau_replay=points[-1].tau_replay,
                   tau_heldout=points[-1].tau_heldout, tau_eval=points[-1].tau_eval,
                   log_tail=tuple(step_line(step, 2.5) for step in range(1100, 1201, 10)))


def runs() -> tuple[RunView, ...]:
    return (
        training_run(),
        RunView(run_id="r-0002", target="pve1/201", name="llama-probe", state="starting", phase="loading_dataset",
                pid=4200, log_tail=("Loading dataset from /workspace/tokenized_completions...",)),
        RunView(run_id="r-0003", target="pve2/300", name="seed-rerun", state="running", phase="training",
                pid=5100, gpus=tuple(range(8)), last_step=8, loss=12.9459, acc=0.019, streak=0.0, lr=4.52e-06,
                tok_per_s=11_700.0, eta_s=11.9 * 86400, q_pre=(50, 50, 50, 49, 50), q_hs=(0,),
                history=tuple(MetricPoint(step=s, loss=13.0 - s / 100, acc=0.02, streak=0.0, tok_per_s=11_700.0)
                              for s in range(1, 9))),
        RunView(run_id="r-0004", target="pve2/301", name="oom-test", state="failed", phase="training", exit_code=1,
                last_step=40, loss=9.8, acc=0.11, streak=0.4, exceptions=1, exception_texts=(TRACEBACK,),
                log_tail=(step_line(40, 9.8), *TRACEBACK.splitlines())),
    )


def gpus() -> tuple[GpuView, ...]:
    busy = tuple(GpuView(target="pve1/200",
                         row=GpuRow(index=i, memory_used_mib=70_000.0 + 1000 * i, memory_total_mib=97_871.0,
                                    utilization_pct=97.0 - i),
                         utilization_history=tuple(60 + 37 * math.sin(t / 6 + i) ** 2 for t in range(60)))
                 for i in range(2))
    idle = tuple(GpuView(target="pve2/300",
                         row=GpuRow(index=i, memory_used_mib=float(mib), memory_total_mib=97_871.0, utilization_pct=0.0),
                         utilization_history=(90.0,) * 20 + (0.0,) * 40)
                 for i, mib in enumerate(SEED_MEMORY_MIB))
    return busy + idle


def hosts(*, pve2_connected: bool = True) -> tuple[HostView, ...]:
    if pve2_connected:
        return HostView(name="pve1", connected=True), HostView(name="pve2", connected=True)
    return (HostView(name="pve1", connected=True),
            HostView(name="pve2", connected=False, error="connection timed out", retry_in_s=8.0))


def alerts() -> tuple[AlertView, ...]:
    return (
        AlertView(time="2026-12-01T11:40:02Z", run_id="r-0004", target="pve2/301", kind="exception", severity="error",
                  message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        AlertView(time="2026-12-01T11:40:03Z", run_id="r-0004", target="pve2/301", kind="ended", severity="info",
                  message="run failed with exit code 1"),
        AlertView(time="2026-12-01T11:58:00Z", run_id="r-0003", target="pve2/300", kind="gpu_idle",
                  severity="warning", message="8 GPUs hold 578 GiB at 0 % utilisation while training"),
        AlertView(time="2026-12-01T11:59:00Z", run_id="r-0003", target="pve2/300", kind="starvation",
                  severity="warning", message="hidden-state queue empty while prefetch queues are full"),
    )


def snapshot() -> Snapshot:
    return Snapshot(taken_at=TAKEN_AT, runs=runs(), gpus=gpus(), hosts=hosts(), alerts=alerts())
