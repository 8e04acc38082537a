"""Checkpoints a server can use as they are: bf16 weights next to exact fp32 master weights, files readable by
other users, and a modeling file that transformers loads (in a process that cannot import the trainer) and that
computes what the trainer's drafter computes."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import REPO_ROOT, trainer_env
from tests.trainer.tiny_models import make_drafter, random_ids, tiny_target_dir  # noqa: F401
from trainer.model.drafter_files import MASTER_WEIGHTS_FILE, MODELING_FILE, WEIGHTS_FILE, load_drafter, save_drafter
from trainer.training.checkpoints import STATE_FILE, save_checkpoint

# interpreters that must load the shipped modeling file: this one, and others a deployment runs (e.g. a venv
# with the GPU machine's transformers release), listed in DFLASH_COMPAT_PYTHONS separated by os.pathsep
PYTHONS = [sys.executable] + [p for p in os.environ.get("DFLASH_COMPAT_PYTHONS", "").split(os.pathsep) if p]

LOAD_SCRIPT = """
import json, sys
sys.modules["trainer"] = None  # any import of the trainer now fails: the modeling file must stand alone
import torch, transformers
from transformers import AutoModel
results = {"version": transformers.__version__}
io = torch.load(sys.argv[1])
for name in sys.argv[2:]:
    model, info = AutoModel.from_pretrained(name, trust_remote_code=True, output_loading_info=True)
    with torch.no_grad():
        hidden = model(target_hidden=io["features"], noise_embedding=io["embedded"], anchors=io["anchors"])
        drafted = hidden.last_hidden_state[:, :, 1:].flatten(0, 1).float()
        chain = model.chain_from_logits(drafted @ io["lm_head"].t(), drafted, io["tokens"].flatten())
    torch.save(hidden.last_hidden_state, name + "/hidden.pt")
    torch.save(chain, name + "/chain.pt")
    results[name] = {"class": type(model).__name__, "dtype": str(model.fc.weight.dtype),
                     "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"])}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    from trainer.model.target import TargetModel

    return TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cpu", dtype=torch.float32)


def trained_like(target, *, seed: int, sliding_window: int | None = None, architecture: str = "dflash"):
    """A drafter whose weights are off their initial values, as a trained one's are."""
    drafter = make_drafter(target, num_layers=2, block_size=4, sliding_window=sliding_window, seed=seed,
                           architecture=architecture)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return drafter


def block_inputs(target, drafter) -> dict:
    input_ids = random_ids(target, (2, 24), seed=7)
    anchors = torch.tensor([[2, 9, 17], [5, 12, -1]])
    tokens = input_ids.gather(1, anchors.clamp(min=0))
    return {"features": target.features(input_ids), "anchors": anchors, "tokens": tokens,
            "embedded": target.embed_tokens(drafter.block_tokens(tokens)).detach(),
            "lm_head": target.lm_head.weight.detach()}


def logits(target, hidden: torch.Tensor) -> torch.Tensor:
    return target.lm_head(hidden[:, :, 1:].float()).detach()


def load_elsewhere(python: str, io_path: Path, checkpoints: list[Path], tmp_path: Path) -> dict:
    """Load the checkpoints with AutoModel in a fresh process that has no trainer on its path."""
    env = {key: value for key, value in trainer_env().items() if key != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "hf_modules")
    result = subprocess.run([python, "-c", LOAD_SCRIPT, str(io_path), *map(str, checkpoints)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("python", PYTHONS)
def test_bf16_checkpoint_loads_through_automodel_and_computes_the_trainers_logits(target, tmp_path, python):
    cases = {"full": trained_like(target, seed=1), "sliding": trained_like(target, seed=2, sliding_window=6),
             "dflash2": trained_like(target, seed=4, sliding_window=6, architecture="dflash2")}
    io = block_inputs(target, cases["full"])
    for name, drafter in cases.items():
        save_drafter(drafter, tmp_path / name, dtype=torch.bfloat16)
    torch.save(io, tmp_path / "io.pt")
    loaded = load_elsewhere(python, tmp_path / "io.pt", [tmp_path / name for name in cases], tmp_path)
    other = trained_like(target, seed=3)
    for name, drafter in cases.items():
        info = loaded[str(tmp_path / name)]
        expected_class = "DFlash2DraftModel" if name == "dflash2" else "DFlashDraftModel"
        assert info == {"class": expected_class, "dtype": "torch.bfloat16", "missing": [], "unexpected": []}
        served = torch.load(tmp_path / name / "hidden.pt")
        with torch.no_grad():
            expected = logits(target, drafter(io["features"], io["tokens"], io["anchors"]))
            unrelated = logits(target, other(io["features"], io["tokens"], io["anchors"]))
            # the trainer's drafter on the very bf16 weights runs the same code: the same numbers
            bf16 = load_drafter(tmp_path / name, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
                                serving=True)
            assert torch.equal(served, bf16(io["features"], io["tokens"], io["anchors"]))
            # the served model drafts the chain the trainer's drafter drafts on the same weights
            chain = bf16.chain(served.flatten(0, 1).float(), io["tokens"].flatten())
            assert torch.equal(torch.load(tmp_path / name / "chain.pt"), chain)
        scale = expected.abs().max()
        assert (logits(target, served) - expected).abs().max() < 0.03 * scale, name  # bf16 rounding only
        assert (unrelated - expected).abs().max() > 0.2 * scale  # the tolerance tells drafters apart


def test_the_modeling_file_imports_only_torch_transformers_and_the_standard_library(tmp_path):
    import trainer.model.modeling_dflash as modeling

    source = Path(modeling.__file__).read_text()
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would not resolve inside a checkpoint"
            roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) == {"torch", "transformers"}


def test_checkpoint_config_names_the_modeling_file_and_vllms_tap_ids(target, tmp_path):
    drafter = trained_like(target, seed=1)
    save_drafter(drafter, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    shipped = REPO_ROOT / "trainer" / "model" / "modeling_dflash.py"
    assert (tmp_path / MODELING_FILE).read_text() == shipped.read_text()
    taps = config["dflash_config"]["target_layer_ids"]
    assert taps == target.layer_ids and config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in taps]


def _checkpoint(drafter, output_dir: Path, step: int, save_dtype: str) -> Path:
    state = {"step": step, "config": {"save_dtype": save_dtype}}
    return save_checkpoint(output_dir, step, drafter=drafter, state=state, keep=0, save_dtype=save_dtype)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoint_files_get_the_mode_the_umask_gives(target, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = _checkpoint(trained_like(target, seed=1), tmp_path, 1, "bfloat16")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in path.iterdir()}
    assert set(modes) >= {WEIGHTS_FILE, MASTER_WEIGHTS_FILE, STATE_FILE, MODELING_FILE, "config.json"}
    assert set(modes.values()) == {mode}, modes


def test_bf16_checkpoints_keep_the_exact_fp32_master_weights(target, tmp_path):
    from safetensors.torch import load_file

    drafter = trained_like(target, seed=1)
    path = _checkpoint(drafter, tmp_path, 5, "bfloat16")
    served = load_file(str(path / WEIGHTS_FILE))
    assert {t.dtype for t in served.values()} == {torch.bfloat16}
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    resumed = load_drafter(path, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    for name, value in drafter.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name  # what a resumed run trains on
        assert torch.equal(served[name], value.to(torch.bfloat16)), name
    serving = load_drafter(path, embed_tokens=target.embed_tokens, lm_head=target.lm_head, serving=True)
    assert serving.fc.weight.dtype == torch.bfloat16
    # fp32 checkpoints need no second copy
    fp32 = _checkpoint(drafter, tmp_path, 6, "float32")
    assert not (fp32 / MASTER_WEIGHTS_FILE).exists()
    assert {t.dtype for t in load_file(str(fp32 / WEIGHTS_FILE)).values()} == {torch.float32}
