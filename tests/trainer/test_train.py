"""End-to-end CPU runs as real processes: learning on self-generated data with eval tau and greedy equality,
resume after SIGKILL giving the same losses, and torchrun with two gloo ranks keeping identical weights."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO_ROOT, run_trainer, trainer_env, write_config


def step_records(output_dir: Path) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if json.loads(line)["event"] == "step"]


def write_untrained_drafter(target: Path, out_dir: Path, *, layers: int, block_size: int,
                            architecture: str = "dflash") -> Path:
    """A freshly initialised drafter; a DFlash2 one with a selector whose pair scores weigh as much as the
    drafter's logits, so that its chain differs from each slot's top-1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.trainer.tiny_models import TINY_DFLASH2
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.drafter_files import save_drafter
    from trainer.planning.dflash2 import Dflash2Sizes
    from trainer.planning.taps import default_target_layer_ids

    model = AutoModelForCausalLM.from_pretrained(str(target))
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    config = DrafterConfig.from_target(
        model.config, num_layers=layers, block_size=block_size, mask_token_id=tokenizer.mask_token_id,
        target_layer_ids=default_target_layer_ids(model.config.num_hidden_layers, layers),
        dflash2=Dflash2Sizes(**TINY_DFLASH2) if architecture == "dflash2" else None)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config, embed_tokens=model.get_input_embeddings(), lm_head=model.get_output_embeddings())
    if architecture == "dflash2":
        with torch.no_grad():
            drafter.candidate_selector.hidden_projection.weight.normal_(std=3.0)
            drafter.candidate_selector.predecessor_codebook.normal_(std=1.0)
            drafter.candidate_selector.successor_codebook.normal_(std=1.0)
    save_drafter(drafter, out_dir)
    return out_dir


def test_training_on_self_generated_data_raises_eval_tau(base_config, tiny_target, self_generated, tmp_path):
    config = {**base_config, "drafter_layers": 2, "max_steps": 150, "log_every": 10}
    result = run_trainer("train", "--config", write_config(tmp_path / "run.yaml", **config))
    assert result.returncode == 0, result.stderr[-3000:]
    records = step_records(Path(config["output_dir"]))
    assert [r["step"] for r in records] == [1, *range(10, 151, 10)]  # step 1 at once, then every 10
    # the default D-PACE loss reweighs slots as confidence grows: its fall is smaller than CE's, accuracy rises
    assert records[-1]["loss"] < 0.75 * records[0]["loss"], [r["loss"] for r in records]
    assert records[-1]["acc"] > records[0]["acc"] + 0.2, [r["acc"] for r in records]
    assert "Loading dataset from" in result.stdout and "Batches per epoch:" in result.stdout

    trained = run_trainer("eval", "--target", tiny_target, "--drafter", Path(config["output_dir"]) / "step_150",
                          "--prompts", self_generated["eval_prompts"], "--max-new-tokens", "64",
                          "--tree-budget", "8,32,64", "--json")
    assert trained.returncode == 0, trained.stderr[-3000:]
    trained_report = json.loads(trained.stdout)
    untrained_report = trained_report["baseline"]  # an untrained drafter of the same shape, in the same run
    assert trained_report["identical_to_greedy"] and untrained_report["identical_to_greedy"]
    assert trained_report["tau"] > untrained_report["tau"] + 0.25, (trained_report, untrained_report)
    # tau counts the tokens kept: the rounds add up to every new token but each prompt's first (the prefill's)
    for report in (trained_report, untrained_report):
        assert round(report["tau"] * report["rounds"]) == report["new_tokens"] - trained_report["prompts"], report
    # DDTree: the drafter's second choices are worth something; trees equal greedy and beat the chain at every
    # budget, more nodes accepting more
    trees = trained_report["trees"]
    assert [tree["budget"] for tree in trees] == [8, 32, 64] and all(tree["identical_to_greedy"] for tree in trees)
    assert all(tree["tau"] >= trained_report["tau"] for tree in trees), [t["tau"] for t in trees]
    assert trees[-1]["tau"] > trees[0]["tau"], [t["tau"] for t in trees]
    for run in (trained_report, untrained_report, *trees):  # share accepting >= k drafts, k = 1..B-1: tau - 1
        assert len(run["acceptance"]) == 7 and abs(sum(run["acceptance"]) - (run["tau"] - 1)) < 1e-9, run


def _start_training(config_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=trainer_env(),
                            cwd=REPO_ROOT)


def _kill_after_first_checkpoint(process: subprocess.Popen, output_dir: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (output_dir / "step_10" / "training_state.pt").exists():
        assert process.poll() is None, process.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()


def test_resume_after_sigkill_repeats_the_uninterrupted_losses(base_config, tmp_path):
    config = {**base_config, "max_steps": 60, "checkpoint_every": 10, "keep_checkpoints": 0}
    whole = {**config, "output_dir": str(tmp_path / "whole")}
    assert run_trainer("train", "--config", write_config(tmp_path / "whole.yaml", **whole)).returncode == 0
    reference = {r["step"]: r for r in step_records(Path(whole["output_dir"]))}

    killed_dir = tmp_path / "killed"
    killed_config = write_config(tmp_path / "killed.yaml", **{**config, "output_dir": str(killed_dir)})
    process = _start_training(killed_config)
    _kill_after_first_checkpoint(process, killed_dir)
    assert process.returncode == -signal.SIGKILL
    assert not (killed_dir / "step_60").exists(), "the run ended before the kill: nothing was tested"

    resumed = run_trainer("train", "--config", killed_config)  # resume: auto
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stdout
    events = [json.loads(line) for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    resume_at = max(i for i, e in enumerate(events) if e["event"] == "resume")
    start_step = events[resume_at]["step"]
    assert start_step >= 10 and start_step % 10 == 0
    after = [e for e in events[resume_at:] if e["event"] == "step"]
    assert [e["step"] for e in after] == list(range(start_step + 1, 61))
    for record in after:
        assert record["loss"] == pytest.approx(reference[record["step"]]["loss"], abs=1e-6), record["step"]
    # the data seen: the killed run's batches up to the checkpoint, then the resumed run's, with no repeat
    before = [e for e in events[:resume_at] if e["event"] == "step" and e["step"] <= start_step]
    positions = [tuple(e["data_position"]) for e in before + after]
    assert positions == [tuple(reference[s]["data_position"]) for s in range(1, 61)]
    assert len(set(positions)) == len(positions)

    logged = len(step_records(killed_dir))
    again = run_trainer("train", "--config", killed_config)  # resuming a finished run trains nothing more
    assert again.returncode == 0 and "Resumed from" in again.stdout and "step=" not in again.stdout
    assert len(step_records(killed_dir)) == logged


def test_complete_checkpoints_ignore_partial_writes(tmp_path):
    from trainer.training.checkpoints import CHECKPOINT_FILES, complete_checkpoints

    for name, files in (("step_5", CHECKPOINT_FILES), ("step_9", CHECKPOINT_FILES[:-1]),
                        (".tmp-step_12-123", CHECKPOINT_FILES), ("step_x", CHECKPOINT_FILES)):
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text("x")
    assert complete_checkpoints(tmp_path) == [(5, tmp_path / "step_5")]


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_torchrun_two_cpu_ranks_keep_identical_weights(base_config, tmp_path, architecture):
    # DFlash2's selector is trained outside the DDP-wrapped forward: its gradients must be all-reduced too
    dflash2 = {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4} if architecture == "dflash2" else {}
    config = {**base_config, "max_steps": 8, "checkpoint_every": 4, **dflash2}
    path = write_config(tmp_path / "ddp.yaml", **config)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "trainer", "train", "--config", str(path)],
        capture_output=True, text=True, timeout=300, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    digests = {int(rank): digest for rank, digest in
               re.findall(r"rank (\d+) drafter weights digest ([0-9a-f]{16})", result.stdout)}
    assert sorted(digests) == [0, 1] and digests[0] == digests[1], (result.stdout + result.stderr)[-4000:]
    records = step_records(Path(config["output_dir"]))
    assert [r["step"] for r in records] == list(range(1, 9))  # rank 0 alone logs
    assert all(r["world_size"] == 2 for r in records)
    # the exposed all-reduce, as DDP times it itself from its first sampled step on
    assert all(r["comm_s"] is not None and r["comm_s"] >= 0 for r in records[1:]), records
    assert result.stdout.count("Loading dataset from") == 1


def test_steps_that_compile_say_so(base_config, tmp_path):
    """With compile: true the first steps build kernels; the log says so instead of looking hung."""
    config = {**base_config, "max_steps": 3, "compile": True, "log_every": 3}
    result = run_trainer("train", "--config", write_config(tmp_path / "compile.yaml", **config), timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = result.stdout.splitlines()
    compiled = [line for line in lines if re.fullmatch(
        r"  step [123] compiled \d+ graph\(s\) for a \d+x\d+ batch with \d+ blocks in a [\d.]+s step "
        r"\(\d+ compiled so far\)", line)]
    assert compiled and compiled[0].startswith("  step 1 compiled"), result.stdout[-3000:]


def test_a_compiled_target_is_compiled_at_start_up_and_nothing_after(base_config, tmp_path):
    """compile_target: the target's layers compile before the first step (a stage line), batches of every shape
    reuse that graph (no step says it compiled), and the Kernels line says the target runs compiled."""
    config = {**base_config, "max_steps": 4, "log_every": 1, "compile_target": True, "pack_target": True}
    result = run_trainer("train", "--config", write_config(tmp_path / "compiled.yaml", **config), timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = result.stdout.splitlines()
    stages = [re.fullmatch(r"Start-up \[[\d.]+s\]: (.+)", line) for line in lines]
    assert [m[1] for m in stages if m] == ["loading target", "building drafter", "compiling the target's layers",
                                           "first step"]
    assert any(line.startswith("Kernels: ") and "; target layers: torch.compile; " in line for line in lines)
    assert len([line for line in lines if re.search(r"\] step=\d+ ", line)]) == 4
    assert not [line for line in lines if " compiled " in line and "graph(s)" in line], result.stdout[-3000:]


def test_start_up_stages_come_in_order_with_their_seconds_and_step_1_is_logged(base_config, tmp_path):
    """Loading, building and the first step are announced with the seconds since start, and the first step
    line comes right after step 1 (not after log_every steps): a long start-up never looks like a hang."""
    config = {**base_config, "max_steps": 4, "log_every": 4}
    result = run_trainer("train", "--config", write_config(tmp_path / "stages.yaml", **config), timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = result.stdout.splitlines()
    stages = [(i, re.fullmatch(r"Start-up \[(\d+\.\d)s\]: (.+)", line)) for i, line in enumerate(lines)]
    stages = [(i, float(m[1]), m[2]) for i, m in stages if m]
    assert [name for _, _, name in stages] == ["loading target", "building drafter", "first step"]
    seconds = [s for _, s, _ in stages]
    assert seconds == sorted(seconds) and seconds[0] > 0
    step_lines = [i for i, line in enumerate(lines) if re.search(r"\] step=\d+ ", line)]
    assert [re.search(r"step=(\d+)", lines[i])[1] for i in step_lines] == ["1", "4"]
    assert stages[-1][0] < step_lines[0]


def test_compile_on_a_gpu_is_refused_before_anything_loads(base_config, tmp_path):
    """compile: true was not measured to work on a GPU: refused at once with the reason (exit 2), not a crash
    minutes into the run."""
    config = {**base_config, "compile": True, "device": "cuda"}
    result = run_trainer("train", "--config", write_config(tmp_path / "gpu-compile.yaml", **config), timeout=300)
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert "compile: true is not supported on a GPU" in result.stderr
    assert "Traceback" not in result.stderr and "Loading" not in result.stdout


def test_each_step_line_is_followed_by_where_the_step_time_went(base_config, tmp_path):
    """The bundled trainer says per log interval how long data wait, target, drafter, optimizer took per step:
    the human line (read by the dashboard's parser) and metrics.jsonl carry the same numbers, and the phases
    never add up to more than the step's wall time."""
    from orchestrator.trainlog.lines import parse_step_times_line

    config = {**base_config, "max_steps": 4, "log_every": 2}
    result = run_trainer("train", "--config", write_config(tmp_path / "times.yaml", **config), timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = result.stdout.splitlines()
    after_steps = [lines[i + 1] for i, line in enumerate(lines) if re.search(r"\] step=\d+ ", line)]
    times = [parse_step_times_line(line) for line in after_steps]
    assert len(times) == 3 and all(times), after_steps  # steps 1, 2 and 4
    records = step_records(Path(config["output_dir"]))
    for parsed, record in zip(times, records):
        assert set(parsed) == {"data", "target", "drafter", "optimizer", "wall"}  # one rank: no comm
        assert record["comm_s"] is None
        for name in ("data", "target", "drafter", "optimizer"):
            assert parsed[name] == pytest.approx(record[f"{name}_s"], abs=6e-4)
        assert record["target_s"] > 0 and record["drafter_s"] > 0
        assert sum(record[f"{n}_s"] for n in ("data", "target", "drafter", "optimizer")) <= record["step_s"] * 1.01
