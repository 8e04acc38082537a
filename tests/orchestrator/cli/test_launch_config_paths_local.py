"""The small CPU run of docs/trainer.md, its relative paths as written, launched with `launch local --config`
from another directory: the paths are taken from the config file's directory (on `local`), not from the run's
own directory where the trainer works, and the run trains and writes its output next to the config."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.lab.workloads import run_cli
from tests.polling import wait_for

DOCS = Path(__file__).resolve().parents[3] / "docs" / "trainer.md"


def docs_small_cpu_config() -> dict:
    section = DOCS.read_text(encoding="utf-8").split("### A small CPU run", 1)[1]
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))


def _tiny_files(project: Path, config: dict) -> None:
    """The tiny target and a prepared dataset where the config's relative paths point, seen from `project`."""
    from trainer.data.prepare import prepare
    from trainer.model.tiny_target import tokenizer_corpus, write_tiny_target

    target = write_tiny_target(project / config["target_path"], seed=0)
    words = " ".join(tokenizer_corpus()).split()
    chats = project / "chats.jsonl"
    with chats.open("w") as sink:
        for i in range(24):
            prompt = " ".join(words[(i * 7 + k) % len(words)] for k in range(8))
            answer = " ".join(words[(i * 5 + k) % len(words)] for k in range(48))
            sink.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                                {"role": "assistant", "content": answer}]}) + "\n")
    prepare(target=target, input_path=chats, output=project / config["data_path"], block_size=config["block_size"],
            heldout=0.0)


def test_the_docs_small_cpu_config_launches_on_local_with_its_relative_paths(inv, tmp_path, capsys, monkeypatch):
    config = docs_small_cpu_config()
    assert not any(Path(config[key]).is_absolute() for key in ("target_path", "data_path", "output_dir"))
    project = tmp_path / "project"
    _tiny_files(project, config)
    config.update(max_steps=4, log_every=1)  # the docs' config as written, only shorter
    config_file = project / "small.yaml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the shell's directory does not matter either

    code, record, err = run_cli(inv, "launch", "local", "--config", str(config_file), "--gpus", "none", "--json",
                                capsys=capsys)
    assert code == 0, err
    run_id = record["run_id"]

    def ended():
        _, listing, _ = run_cli(inv, "ps", "--all", "--json", capsys=capsys)
        run = next(r for r in listing["runs"] if r["run_id"] == run_id)
        return run if run["state"] not in ("starting", "running") else None

    run = wait_for(ended, timeout=600, interval=1, what="the run to end")
    _, log, _ = run_cli(inv, "logs", run_id, "-n", "40", capsys=capsys)
    assert run["state"] == "succeeded", log
    output = project / config["output_dir"]
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s.get("event") == "step"][-1] == 4
    assert not (Path(run["log_path"]).parent / config["output_dir"]).exists()  # not in the run's own directory
