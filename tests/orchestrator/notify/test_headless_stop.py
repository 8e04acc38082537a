"""`watch --headless` stopped from its terminal: Ctrl-C reaches its whole process group, its local watch agent
too, and the watcher's own stop is no news: no `host` line says the host was lost."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.lab.workloads import write_local_inventory
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[3]


def test_ctrl_c_to_the_watchers_process_group_prints_no_host_lost_line(tmp_path: Path) -> None:
    inv = write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")
    printed: list[dict] = []
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", inv, "watch", "local", "--headless"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    reader = threading.Thread(target=lambda: printed.extend(json.loads(line) for line in watcher.stdout), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any(line["type"] == "host" for line in printed), 60), printed
        time.sleep(2.0)  # past its start-up's changes: idle, waiting on its source, as it is most of the time
        os.killpg(watcher.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
        watcher.wait(30)
        reader.join(10)
        err = watcher.stderr.read()
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0 and "Traceback" not in err, err
    assert [(line["host"], line["connected"]) for line in printed if line["type"] == "host"] == [("local", True)]
