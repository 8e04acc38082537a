#!/usr/bin/python3
"""PID 1 that reaps, as systemd does in a Proxmox container (`lxc.init.cmd: /opt/lab/bin/reaping-init`): waits
for every child, its own and the orphans it inherits; ends on SIGTERM, SIGINT or SIGPWR."""
import os
import signal
import sys
import time


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPWR):
        signal.signal(sig, lambda *_: sys.exit(0))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.1)


if __name__ == "__main__":
    main()
