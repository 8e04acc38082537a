"""`dflashctl pull` on the lab: a run's checkpoint through the real sshd and the pct stand-in, a pull cut
mid-file by a dead link that the next pull resumes and verifies, a 300 MB checkpoint pulled with bounded memory,
a different local file left alone without --force, and an export made on the target that AutoModel loads."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab.workloads import link_outputs_argv, quick_inventory, write_checkpoint_dir
from tests.lab.workloads import run_cli as cli
from tests.polling import wait_for

pytestmark = pytest.mark.lab
HOST, CTID = "pve2", 300
TARGET = f"{HOST}/{CTID}"
REPO = Path(__file__).resolve().parents[2]
BIG = 300 * 2**20
RSS_BOUND_KIB = 150 * 1024

# the CLI in a process of its own, its peak RSS above what importing it took, on stderr's last line
MEASURED = """
import json, resource, sys
from orchestrator.cli import main
import fabric, paramiko, rich.progress  # noqa: F401  (loaded before the baseline: imports are not the pull)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = main(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.stderr.write("\\n" + json.dumps({"code": code, "base_kib": base, "peak_kib": peak}) + "\\n")
sys.exit(code)
"""


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    quick_inventory(lab, path)
    return str(path)


def inside(lab, name: str) -> tuple[Path, str]:
    """A fresh directory in the container's /workspace: as this machine sees it, and as the container does."""
    tag = f"pull-{name}-{os.getpid()}-{time.monotonic_ns()}"
    return lab.hosts[HOST].containers[CTID].workspace / tag, f"/workspace/{tag}"


def launch_with_outputs(inv: str, name: str, output_dir: str, capsys) -> dict:
    code, record, err = cli(inv, "launch", TARGET, "--name", name, "--gpus", "none", "--json", "--",
                            *link_outputs_argv(output_dir), capsys=capsys)
    assert code == 0, err
    return record


@pytest.fixture(scope="module")
def big_run(lab, inv, tmp_path_factory):
    """A run on pve2/300 whose step_7/ holds a 300 MB training state (random bytes: nothing compresses it)."""
    outside, path = inside(lab, "big")
    state = outside / "step_7" / "training_state.pt"
    state.parent.mkdir(parents=True)
    with open(state, "wb") as sink:
        for _ in range(BIG // 2**20):
            sink.write(os.urandom(2**20))
    write_checkpoint_dir(outside / "step_7", {"model.safetensors": b"w" * 4096})
    manifest = json.loads((outside / "step_7" / "manifest.json").read_text())
    manifest["files"]["training_state.pt"] = {"size": BIG, "sha256": sha256(state)}
    (outside / "step_7" / "manifest.json").write_text(json.dumps(manifest))
    (outside / "metrics.jsonl").write_text('{"event": "step", "step": 7}\n')
    name = outside.name  # unique: the pulls below name the run by it
    from orchestrator.cli import main
    assert main(["--inventory", inv, "launch", TARGET, "--name", name, "--gpus", "none", "--",
                 *link_outputs_argv(path)]) == 0
    return {"name": name, "sha256": manifest["files"]["training_state.pt"]["sha256"]}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for chunk in iter(lambda: source.read(2**22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pull_process(inv: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", MEASURED, "--inventory", inv, "pull", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_pull_brings_a_checkpoint_through_ssh_and_pct_exec(lab, inv, tmp_path, capsys):
    outside, path = inside(lab, "small")
    write_checkpoint_dir(outside / "step_3", {"model.safetensors": b"m" * 5000, "training_state.pt": b"s" * 7000})
    (outside / "metrics.jsonl").write_text('{"event": "step", "step": 3}\n')
    record = launch_with_outputs(inv, "small", path, capsys)
    code, result, err = cli(inv, "pull", record["run_id"], "--to", str(tmp_path / "got"), "--json", capsys=capsys)
    assert code == 0, err
    assert result["target"] == TARGET and result["checkpoints"] == ["step_3"]
    assert (tmp_path / "got" / "step_3" / "training_state.pt").read_bytes() == b"s" * 7000
    assert (tmp_path / "got" / "metrics.jsonl").read_text() == '{"event": "step", "step": 3}\n'
    assert f"outputs in {path}" in (tmp_path / "got" / "train.log").read_text()
    # a different file here is left alone without --force, and nothing else is fetched either
    (tmp_path / "mine" / "step_3").mkdir(parents=True)
    (tmp_path / "mine" / "step_3" / "model.safetensors").write_bytes(b"mine")
    code, out, err = cli(inv, "pull", record["run_id"], "--to", str(tmp_path / "mine"), capsys=capsys)
    assert code == 1 and "refusing to overwrite" in err and "--force" in err
    assert (tmp_path / "mine" / "step_3" / "model.safetensors").read_bytes() == b"mine"
    assert sorted(p.name for p in (tmp_path / "mine").rglob("*")) == ["model.safetensors", "step_3"]


def test_a_pull_cut_mid_file_by_a_dead_link_resumes_and_verifies(lab, inv, big_run, tmp_path):
    dest = tmp_path / "got"
    part = dest / "step_7" / "training_state.pt.part"
    proc = pull_process(inv, big_run["name"], "--to", str(dest), "--stall", "3")
    try:
        wait_for(lambda: part.is_file() and part.stat().st_size > 30 * 2**20 or proc.poll() is not None,
                 timeout=120, interval=0.005)
        lab.link_down(HOST)
        try:
            assert proc.wait(timeout=60) == 3, proc.stderr.read()[-2000:]
        finally:
            lab.link_up(HOST)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "cut at byte" in err and "resumes" in err, err[-2000:]
    cut_at = part.stat().st_size
    assert 0 < cut_at < BIG and not (dest / "step_7" / "training_state.pt").exists()
    again = pull_process(inv, big_run["name"], "--to", str(dest), "--json")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    state = next(f for f in json.loads(out)["files"] if f["path"] == "step_7/training_state.pt")
    assert state["action"] == "resume" and state["resumed_from"] == cut_at
    assert sha256(dest / "step_7" / "training_state.pt") == big_run["sha256"] and not part.exists()


def test_a_300_mb_checkpoint_is_pulled_with_bounded_memory(inv, big_run, tmp_path):
    proc = pull_process(inv, big_run["name"], "--to", str(tmp_path / "got"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    measured = json.loads(err.strip().splitlines()[-1])
    assert sha256(tmp_path / "got" / "step_7" / "training_state.pt") == big_run["sha256"]
    grew = measured["peak_kib"] - measured["base_kib"]
    assert grew < RSS_BOUND_KIB, f"the pull's peak RSS grew by {grew / 1024:.0f} MiB for a 300 MiB file"
    assert "all verified" in out


LOAD = """
import json, sys
sys.modules["trainer"] = None  # the pulled directory must stand alone, as on a serving machine
from transformers import AutoModel
model, info = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True, output_loading_info=True)
print(json.dumps({"class": type(model).__name__, "dtype": str(model.fc.weight.dtype),
                  "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                  "fc": model.fc.weight.float().sum().item()}))
"""


def test_a_pulled_export_loads_in_automodel(lab, inv, tmp_path, capsys):
    import torch

    from tests.trainer.model.test_serving import trained_like
    from trainer.model.target import TargetModel
    from trainer.model.tiny_target import write_tiny_target
    from trainer.training.checkpoints import save_checkpoint

    outside, path = inside(lab, "export")
    write_tiny_target(outside / "target", seed=0)
    target = TargetModel.load(outside / "target", layer_ids=None, num_taps=3, device="cpu", dtype=torch.float32)
    drafter = trained_like(target, seed=5)
    state = {"step": 5, "config": {"target_path": f"{path}/target", "loss": "ce"}}
    save_checkpoint(outside / "out", 5, drafter=drafter, state=state, keep=0, save_dtype="bfloat16")
    (outside / "out" / "metrics.jsonl").write_text('{"event": "step", "step": 5}\n')
    record = launch_with_outputs(inv, "exported", f"{path}/out", capsys)
    dest = tmp_path / "drafter"
    code, result, err = cli(inv, "pull", record["run_id"], "--export", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0, err
    assert f"{TARGET}: exporting step_5 for serving" in err and f"{TARGET}: exported step_5 in " in err  # not silent
    assert result["export"] and result["checkpoints"] == ["step_5"]
    assert {"config.json", "model.safetensors", "dflash.py", "README.md"} <= {f["path"] for f in result["files"]}
    assert not (dest / "training_state.pt").exists() and "# DFlash drafter" in (dest / "README.md").read_text()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "hf_modules")
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(dest)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    info = json.loads(loaded.stdout.splitlines()[-1])
    assert info["class"] == "DFlashDraftModel" and info["dtype"] == "torch.bfloat16"
    assert info["missing"] == [] and info["unexpected"] == []
    expected = drafter.fc.weight.detach().to(torch.bfloat16).float().sum().item()
    assert info["fc"] == pytest.approx(expected, rel=1e-6)  # the trained weights, not a fresh init
