"""The pre-flight check: every problem of a config in one pass, paths before what is read from them, no torch."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO_ROOT, run_trainer, trainer_env, write_config
from trainer.config import suggest_key
from trainer.planning.preflight import check_config_file


def _check(tmp_path, config: dict, *args: str) -> subprocess.CompletedProcess:
    path = write_config(tmp_path / "run.yaml", **config)
    return run_trainer("check", "--config", path, *args)


def _problem_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def test_every_problem_of_a_config_in_one_pass_each_naming_its_key(tmp_path, base_config):
    config = {**base_config, "learning_rate": 1e-3, "lr": "fast", "token_budget": 100,
              "data_path": str(tmp_path / "no_data"), "output_dir": str(tmp_path / "a_file" / "out")}
    (tmp_path / "a_file").write_text("")
    for command in ("check", "train"):
        result = run_trainer(command, "--config", write_config(tmp_path / "run.yaml", **config))
        assert result.returncode == 2, result.stderr
        lines = _problem_lines(result)
        assert "Traceback" not in result.stderr and len(lines) == 5, result.stderr
        keys = ["learning_rate", "lr", "token_budget", "data_path", "output_dir"]
        for line, key in zip(lines, keys):
            assert line.startswith(f"error: {tmp_path / 'run.yaml'}: ") and key in line, (key, line)
        assert "did you mean 'lr'?" in lines[0] and "does not exist" in lines[3]


def test_a_missing_data_path_is_named_before_the_knock_on_of_the_default_taps(tmp_path, base_config):
    """The tiny target has 6 layers: the default 5 taps do not fit, and that is reported too, after the path."""
    config = {key: value for key, value in base_config.items() if key != "drafter_layers"}
    result = _check(tmp_path, {**config, "data_path": str(tmp_path / "nowhere")})
    lines = _problem_lines(result)
    assert result.returncode == 2 and len(lines) == 2, result.stderr
    assert f"data_path: dataset directory {tmp_path / 'nowhere'} does not exist" in lines[0]
    assert "drafter_layers: a 6-layer target has too few layers for 5 taps" in lines[1]


def test_checks_that_need_a_missing_path_are_skipped(tmp_path, base_config):
    config = {key: value for key, value in base_config.items() if key != "drafter_layers"}
    result = _check(tmp_path, {**config, "target_path": str(tmp_path / "no_target"), "drafter_layers": 9})
    lines = _problem_lines(result)
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "target_path: target directory" in lines[0] and "does not exist" in lines[0]


def test_a_bad_value_is_left_out_of_the_checks_that_read_it(tmp_path, base_config):
    """buckets is invalid: token_budget is not compared against the default buckets instead."""
    result = _check(tmp_path, {**base_config, "buckets": "short", "token_budget": 300})
    lines = _problem_lines(result)
    assert result.returncode == 2 and len(lines) == 1 and "buckets: Input should be a valid list" in lines[0]


@pytest.mark.parametrize(("key", "meant"), [("learning_rate", "lr"), ("model_path", "target_path"),
                                            ("batch_size", "token_budget"), ("epochz", "epochs"),
                                            ("Num-Anchors", "num_anchors"), ("zzzz", None)])
def test_unknown_keys_get_a_did_you_mean(key, meant):
    assert suggest_key(key) == meant


def test_relative_paths_are_taken_from_the_run_directory_which_need_not_exist(tmp_path, base_config):
    run_dir = tmp_path / "runs" / "r1"   # made by the run's start, after the check
    relative = {**base_config, "data_path": "../../data", "output_dir": "out/nested"}
    path = write_config(tmp_path / "run.yaml", **relative)
    found = check_config_file(path, base_dir=str(run_dir))
    assert [p.key for p in found.problems] == ["data_path"]
    assert f"'../../data' (= {tmp_path / 'data'}) does not exist" in found.problems[0].message
    (tmp_path / "data").symlink_to(base_config["data_path"])
    found = check_config_file(path, base_dir=str(run_dir))
    assert found.ok and found.layer_ids == [3] and found.data_files == 1, found.problems


def test_the_dataset_is_read_from_its_json_files(tmp_path, base_config, self_generated):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(self_generated["dataset"], broken)
    info = json.loads((broken / "dataset_info.json").read_text())
    del info["features"]["loss_mask"]
    (broken / "dataset_info.json").write_text(json.dumps(info))
    state = json.loads((broken / "state.json").read_text())
    found = check_config_file(write_config(tmp_path / "run.yaml", **{**base_config, "data_path": str(broken)}))
    assert [p.message.split(" (has")[0] for p in found.problems] == [
        f"data_path: dataset {broken} lacks the column(s) loss_mask"]
    (broken / state["_data_files"][0]["filename"]).unlink()
    found = check_config_file(tmp_path / "run.yaml")
    assert "is incomplete" in found.problems[0].message


def test_check_reads_stdin_prints_json_and_passes_a_valid_config(tmp_path, base_config):
    text = (write_config(tmp_path / "run.yaml", **base_config)).read_text()
    result = subprocess.run([sys.executable, "-m", "trainer", "check", "--config", "-", "--json", "--source",
                             "mine.yaml"], input=text, capture_output=True, text=True, env=trainer_env(),
                            cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["problems"] == [] and report["target_layers"] == 6
    assert report["source"] == "mine.yaml" and report["target_layer_ids"] == [3]
    bad = subprocess.run([sys.executable, "-m", "trainer", "check", "--config", "-", "--json"],
                         input=text + "epochz: 2\n", capture_output=True, text=True, env=trainer_env(),
                         cwd=REPO_ROOT, timeout=60)
    assert bad.returncode == 2 and json.loads(bad.stdout)["problems"][0]["key"] == "epochz"


def test_check_imports_neither_torch_nor_numpy_nor_pyarrow(tmp_path, base_config):
    path = write_config(tmp_path / "run.yaml", **base_config)
    probe = ("import sys; from trainer.__main__ import main; code = main(['check', '--config', sys.argv[1]]); "
             "heavy = sorted({'torch', 'numpy', 'pyarrow', 'transformers', 'datasets'} & set(sys.modules)); "
             "print(code, heavy)")
    result = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True,
                            env=trainer_env(), cwd=REPO_ROOT, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "0 []", result.stdout + result.stderr


def test_a_python_without_what_train_imports_is_named(tmp_path, base_config, monkeypatch):
    import trainer.planning.preflight

    monkeypatch.setattr(trainer.planning.preflight, "TRAIN_MODULES", ("torch", "no_such_module_for_training"))
    found = check_config_file(write_config(tmp_path / "run.yaml", **base_config))
    assert [p.key for p in found.problems] == ["python"]
    assert f"python: {sys.executable} has no no_such_module_for_training" in found.problems[0].message


def test_dflash2_sizes_the_target_cannot_take_are_named_before_loading(tmp_path, base_config):
    """The tiny target: hidden size 64, vocabulary 320; the check reads both from its config.json."""
    config = {**base_config, "architecture": "dflash2", "conv_group_size": 24, "selector_top_k": 100000}
    result = run_trainer("check", "--config", write_config(tmp_path / "run.yaml", **config))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = _problem_lines(result)
    assert any("conv_group_size=24 does not divide the hidden size 64" in line for line in lines), lines
    assert any("selector_top_k=100000 must be between 1 and the vocabulary size" in line for line in lines), lines
    fine = {**base_config, "architecture": "dflash2", "selector_rank": 8}
    assert run_trainer("check", "--config", write_config(tmp_path / "ok.yaml", **fine)).returncode == 0


def test_a_compiled_hybrid_target_is_refused_before_loading(tmp_path, base_config):
    """compile_target compiles dense layers; a Qwen3.5 hybrid's Gated DeltaNet layers are named as the reason."""
    from trainer.model.tiny_target import write_tiny_target

    hybrid = write_tiny_target(tmp_path / "hybrid", family="qwen3.5")
    config = {**base_config, "compile_target": True, "target_layer_ids": [1, 3]}
    found = check_config_file(write_config(tmp_path / "run.yaml", **{**config, "target_path": str(hybrid)}))
    assert [p.key for p in found.problems] == ["compile_target"]
    assert "Gated DeltaNet" in found.problems[0].message
    auto = {**config, "compile_target": "auto", "target_path": str(hybrid)}   # the default: leaves a hybrid eager
    assert not check_config_file(write_config(tmp_path / "auto.yaml", **auto)).problems
    assert not check_config_file(write_config(tmp_path / "dense.yaml", **config)).problems
