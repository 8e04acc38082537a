"""The watch agent's GPU samples: one `nvidia-smi --query-gpu=... --loop=S` child for the whole watch (not one
process per sample), its rows grouped into one message per sample (dflash_records.watchwire.GpuMessage)."""
from __future__ import annotations

import os
import shutil
import subprocess

from dflash_records.protocol import GPU_FIELDS, ascii_decimal, gpu_query_args
from dflash_records.watchwire import GpuMessage



class GpuSampler:
    """One `nvidia-smi --query-gpu=... -l S` child; its rows grouped into one message per sample."""

    def __init__(self, out, interval: float) -> None:
        self.out = out
        self.proc = None
        self.buffer = b""
        self.rows: list = []
        self.indices: set = set()
        self.last_row_at = 0.0
        binary = shutil.which("nvidia-smi")
        if binary is None:
            out.send(GpuMessage(error="nvidia-smi is not installed"))
            return
        # whole seconds with --loop (every nvidia-smi has it); --loop-ms only for sub-second sampling
        loop = "--loop={}".format(int(interval)) if interval >= 1 and interval == int(interval) \
            else "--loop-ms={}".format(max(1, int(interval * 1000)))
        try:
            self.proc = subprocess.Popen([binary] + gpu_query_args(GPU_FIELDS) + [loop],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
        except OSError as exc:
            out.send(GpuMessage(error="cannot run nvidia-smi: {}".format(exc)))

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read(self, now: float) -> None:
        data = os.read(self.fileno(), 65536)
        if not data:
            self._ended()
            return
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            index = line.split(",", 1)[0].strip()
            if ascii_decimal(index) is None:
                self.rows.append(line)  # an error message; sent with the sample (or at the end)
                continue
            if index in self.indices:  # the next sample began
                self.flush()
            self.indices.add(index)
            self.rows.append(line)
            self.last_row_at = now

    def flush_if_quiet(self, now: float) -> None:
        # the rows of one sample come in one burst; a short silence ends the sample
        if self.rows and now - self.last_row_at >= 0.05:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.out.send(GpuMessage(csv="\n".join(self.rows)))
        self.rows, self.indices = [], set()

    def _ended(self) -> None:
        code = self.proc.wait()
        text = "\n".join(self.rows + [self.buffer.decode("utf-8", "replace")]).strip()
        self.rows, self.buffer = [], b""
        self.out.send(GpuMessage(error="nvidia-smi exited {}: {}".format(code, text[-500:])))
        self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()  # reaped: no zombie left behind, whatever PID 1 does
        self.proc.stdout.close()
        self.proc = None
