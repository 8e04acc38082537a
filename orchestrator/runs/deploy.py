"""Ship the in-container agent and the bundled trainer to a target, once per version.

Both are content-addressed: the agent as `{workdir}/.dflash/agent/agent-<digest>.pyz`, the trainer unpacked in
`{workdir}/.dflash/pkg/<digest>/`. A version already there is not sent again. Agent calls do not ask first:
each carries the agent's size and hash and is checked on the target in the same command (agentcall.py), so a
command costs one session per target and deploy() runs only after a call answered that the agent is missing or
damaged. A trainer launch or check does not ask either: its call leases the trainer package in the same command
(`--lease-pkg`) or answers that it is absent, and only then is the trainer sent (send_trainer: the agent's
`packages`, which also leases it and removes the versions beside it that no live run uses). A job checks its
config on every node before it starts any (jobs.py), and so deploys there first: no node waits at the
rendezvous for another's upload. Archives are built deterministically (bundle.py) so the digest changes only
with the code.
"""
from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import trainer

from dflash_records.plans import PackagesAnswer
from dflash_records.protocol import UPLOAD_STALL_S, state_path

from ..errors import TransportError
from ..inventory.model import Target
from ..transports.base import Transport
from ..transports.timeouts import DEPLOY_CHECK_TIMEOUT_S, UPLOAD_TIMEOUT_S
from .agentcall import agent_answer, agent_argv
from .bundle import RECORDS_DIR, RECORDS_PACKAGE, build_tarball, build_zipapp, bundle_digest
from .spec import runs_dir

log = logging.getLogger("dflashctl.deploy")
# $1 agent path, $2 trainer dir, $3 agent size, $4 agent sha256: an agent file that is not exactly the one its
# name promises (an upload that an older version installed cut short) counts as absent and is replaced. The
# temp file of an upload whose receiving shell was killed by the cut (pct kills the command's group) is removed
# once no process holds the pid in its name.
PRESENT = ('for t in "${1%/*}"/agent-*.tmp.*; do [ -e "$t" ] || continue; kill -0 "${t##*.}" 2>/dev/null || '
           'rm -f -- "$t"; done; if test -f "$1"; then if [ $(($(wc -c < "$1"))) -eq "$3" ] && { ! command -v sha256sum >/dev/null '
           '2>&1 || [ "$(sha256sum < "$1" | cut -d" " -f1)" = "$4" ]; }; then echo agent; else echo agent-damaged; '
           'fi; fi; test -d "$2/trainer" && echo pkg; true')


@dataclass(frozen=True)
class Bundle:
    data: bytes
    digest: str

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class Deployment:
    agent_path: str
    pkg_dir: str      # put on PYTHONPATH so `python -m trainer` finds the bundled trainer
    sent: tuple[str, ...]  # what had to be sent this time ("agent", "pkg")


@functools.lru_cache(maxsize=1)
def agent_bundle() -> Bundle:
    data = build_zipapp()
    return Bundle(data, bundle_digest(data))


@functools.lru_cache(maxsize=1)
def trainer_bundle() -> Bundle:
    """The trainer and the records it writes as a tar.gz, named by the digest of the tar: what lands on disk,
    whatever zlib compressed it."""
    tar, data = build_tarball({"trainer": Path(trainer.__file__).resolve().parent, RECORDS_PACKAGE: RECORDS_DIR})
    return Bundle(data, bundle_digest(tar))


def agent_path_in(workdir: str) -> str:
    return state_path(workdir, "agent", f"agent-{agent_bundle().digest}.pyz")


def pkg_dir_in(workdir: str) -> str:
    return state_path(workdir, "pkg", trainer_bundle().digest)


def present(transport: Transport, workdir: str) -> set[str]:
    """What of this version is on the target: "agent" (whole, as its hash says), "agent-damaged", "pkg"."""
    agent = agent_bundle()
    result = transport.run(["sh", "-c", PRESENT, "sh", agent_path_in(workdir), pkg_dir_in(workdir),
                            str(len(agent.data)), agent.sha256],
                           timeout=DEPLOY_CHECK_TIMEOUT_S)
    if not result.ok:  # the script always exits 0 once it runs: the target itself refused (e.g. CT stopped)
        reason = (result.err or result.out).strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
        raise TransportError(f"{transport.label}: cannot run commands there: {reason[0]}")
    return set(result.out.split())


def deploy(transport: Transport, target: Target, *, with_trainer: bool) -> Deployment:
    """Make sure the agent (and, for trainer runs, the trainer) of this version are on the target."""
    agent = agent_bundle()
    agent_path, pkg_dir = agent_path_in(target.workdir), pkg_dir_in(target.workdir)
    have = present(transport, target.workdir)
    sent = []
    if "agent-damaged" in have:
        log.warning("%s: %s is damaged (not the content its name promises); replacing it", transport.label,
                    agent_path)
    if "agent" not in have:
        transport.write_file(agent_path, agent.data, mode=0o644)
        sent.append("agent")
    if with_trainer:
        send = "pkg" not in have
        _packages(transport, target, agent_path, pkg_dir, send=send)
        if send:
            sent.append("pkg")
    if sent:
        log.info("%s: deployed %s", transport.label, ", ".join(sent))
    return Deployment(agent_path=agent_path, pkg_dir=pkg_dir, sent=tuple(sent))


def send_trainer(transport: Transport, target: Target) -> None:
    """Send and install this version's trainer (a call answered that it is absent; the agent is there)."""
    _packages(transport, target, agent_path_in(target.workdir), pkg_dir_in(target.workdir), send=True)
    log.info("%s: deployed pkg", transport.label)


def _packages(transport: Transport, target: Target, agent_path: str, pkg_dir: str, *, send: bool) -> None:
    """The agent's `packages`: install the trainer (when `send`), lease it to this launch, remove the versions
    nothing uses."""
    args = ["packages", "--dir", pkg_dir, "--runs-dir", runs_dir(target)]
    data = trainer_bundle().data
    if send:
        args += ["--size", str(len(data)), "--sha256", hashlib.sha256(data).hexdigest(),
                 "--stall", f"{UPLOAD_STALL_S:g}"]
    result = transport.run(agent_argv(target, agent_path, *args), stdin=data if send else None,
                           timeout=UPLOAD_TIMEOUT_S)
    answer = PackagesAnswer.from_dict(agent_answer(target, result))
    if not answer.ok:
        raise TransportError(f"{transport.label}: cannot unpack the trainer in {pkg_dir}: {answer.error}")
    if answer.removed:
        log.info("%s: removed trainer versions no run uses: %s", transport.label, ", ".join(answer.removed))
