"""The installed `dflashctl` console script, run as a subprocess on each usage mistake a new user makes.

Runs the script named by $DFLASHCTL_CONSOLE_SCRIPT (CI points it at a fresh controller-only venv), else the
`dflashctl` on PATH: whatever typer and click that install resolved, every mistake must be exit 2 with a
`dflashctl: error:` line and the usage, never a traceback.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script() -> tuple[str | None, str | None]:
    """(the script to run, why none is run)."""
    named = os.environ.get("DFLASHCTL_CONSOLE_SCRIPT")
    if named:
        return named, None
    found = shutil.which("dflashctl")
    if found is None:
        return None, "no dflashctl console script on PATH and $DFLASHCTL_CONSOLE_SCRIPT unset (pip install -e .)"
    # the script's own interpreter: does it run this checkout's code (an editable install of it)?
    with open(found, "rb") as handle:
        shebang = handle.readline().decode(errors="replace")
    python = shebang[2:].strip() if shebang.startswith("#!") and "python" in shebang else None
    if python:
        where = subprocess.run([*python.split(), "-c", "import orchestrator; print(orchestrator.__file__)"],
                               cwd="/", capture_output=True, text=True, timeout=60).stdout.strip()
        if where and not Path(where).resolve().is_relative_to(REPO):
            return None, f"the dflashctl on PATH runs another checkout ({where}), not this one"
    return found, None


SCRIPT, WHY_NOT = _script()
pytestmark = [pytest.mark.console_script, pytest.mark.skipif(SCRIPT is None, reason=WHY_NOT or "")]


def dflashctl(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The console script in an empty directory, with the local target's workdir under tmp_path."""
    env = {k: v for k, v in os.environ.items() if k != "DFLASHCTL_INVENTORY"}
    env.update(XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="100")
    return subprocess.run([SCRIPT, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


MISTAKES = {
    "unknown command": (["lanch", "local"], ["no such command 'lanch'", "did you mean 'launch'"]),
    "unknown option": (["ps", "--jsn"], ["No such option: --jsn", "did you mean --json?"]),
    "missing argument": (["logs"], ["Missing argument 'RUN'"]),
    # the same words from every typer (typer >= 0.26 said pydantic's "Input should be a valid integer, ...")
    "not a number": (["logs", "x", "-n", "abc"], ["'--lines'", "expected a whole number, got 'abc'"]),
    "not a number of seconds": (["kill", "--grace", "soon", "x"], ["'--grace'", "expected a number, got 'soon'"]),
    "bad restart count": (["launch", "local", "--restart", "on-failure:x", "--", "true"],
                          ["'--restart'", "bad restart count in 'on-failure:x'"]),
    "unknown restart policy": (["launch", "local", "--restart", "always", "--", "true"],
                               ["'--restart'", "unknown restart policy 'always'"]),
    # nan, inf and a negative number in one wording (typer's range check and ours said them differently)
    "nan seconds": (["kill", "--grace", "nan", "x"], ["'--grace'", "expected a number of at least 0, got nan"]),
    "infinite seconds": (["kill", "--grace", "inf", "x"], ["'--grace'", "expected a number of at least 0, got inf"]),
    "negative seconds": (["kill", "--grace", "-1", "x"], ["'--grace'", "expected a number of at least 0, got -1"]),
    "nan stall": (["watch", "--stall", "nan"], ["'--stall'", "expected a number of at least 0.1, got nan"]),
    "nan dist-timeout": (["launch", "a", "b", "--config", "c.yaml", "--dist-timeout", "nan"],
                         ["'--dist-timeout'", "expected a number of at least 1, got nan"]),
    "unknown root option": (["--frobnicate"], ["No such option: --frobnicate"]),
    "share past 100 %": (["watch", "--min-free-pct", "150", "local"], ["'--min-free-pct'"]),
}


@pytest.mark.parametrize("args, words", [(["launch", "local", "--each"], "nothing to run"),
                                         (["launch", "nosuch", "--each", "--", "true"], "unknown host 'nosuch'"),
                                         # `sleep` is no target: the command, not the first of the targets
                                         (["launch", "--each", "--", "sleep", "300"], "no TARGET before `--`"),
                                         (["launch", "local", "local", "--", "true"], "2 TARGETs before `--`")])
def test_launch_each_refuses_a_bad_fleet_in_one_line(tmp_path, args, words):
    """launch --each's own checks (after parsing): exit 2, one line that says what is wrong, nothing started."""
    done = dflashctl(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith("dflashctl: error: ")
    assert words in done.stderr and "Traceback" not in done.stderr


SWEEP_GRID = ["--set", "lr=" + ",".join(map(str, range(1, 18))), "--set", "seed=" + ",".join(map(str, range(16)))]


@pytest.mark.parametrize("args, words", [
    (["launch", "local", "--gpu-count", "0", "--", "true"], "--gpu-count 0: give a number of GPUs from 1"),
    (["launch", "local", "--gpus", "0", "--gpu-count", "1", "--", "true"], "give either --gpus"),
    (["launch", "--anywhere", "--", "true"], "--anywhere needs --gpu-count N"),
    (["launch", "--hosts", "pve*", "--", "true"], "--hosts chooses among the targets of --anywhere"),
    (["sweep", "c.yaml", "--set", "lr=", "local"], "bad --set 'lr=': give lr one or more values"),
    (["sweep", "c.yaml", "--set", "nosuchkey=1,2", "local"], "unknown config key 'nosuchkey'"),
    (["sweep", "c.yaml", *SWEEP_GRID, "local"], "the grid has 272 runs (17 x 16), more than 256"),
    (["ps", "--queue", "nosuch"], "unknown host 'nosuch'"),
], ids=["gpu-count-0", "gpus-and-gpu-count", "anywhere-without-count", "hosts-without-anywhere", "set-no-values",
        "set-unknown-key", "grid-past-256", "ps-queue-unknown-host"])
def test_the_queue_placement_and_sweep_mistakes_are_one_line_and_exit_2(tmp_path, args, words):
    """The installed script refuses each before anything is contacted or queued: exit 2, one line."""
    (tmp_path / "c.yaml").write_text("target_path: t\ndata_path: d\noutput_dir: o\n")
    done = dflashctl(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith("dflashctl: error: ")
    assert words in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists() or not list((tmp_path / "data").rglob("runs/*"))  # nothing queued


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_each_usage_mistake_is_exit_2_with_a_message_and_the_usage(tmp_path, case):
    args, words = MISTAKES[case]
    done = dflashctl(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    first = done.stderr.splitlines()[0]
    assert first.startswith("dflashctl: error: "), done.stderr
    for word in words:
        assert word in first, done.stderr
    assert "Usage: dflashctl" in done.stderr and "--help' for help" in done.stderr
    bad_value = args[-1] if args[-2:-1] != ["--"] else args[-4]  # each value is named once, not twice
    assert first.count(bad_value) <= 1, first


def test_a_target_typed_wrong_gets_the_close_inventory_name(tmp_path):
    done = dflashctl(tmp_path, "launch", "lcoal", "--", "true")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("dflashctl: error: unknown host 'lcoal' (did you mean 'local'?)"), done.stderr


def test_a_gpus_value_that_is_neither_indices_nor_none_is_exit_2_naming_both(tmp_path):
    """--gpus is checked in the command (ranges, `none`): one error line, exit 2, nothing launched."""
    done = dflashctl(tmp_path, "launch", "local", "--gpus", "nothing", "--", "true")
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.stderr.splitlines()[0] == ("dflashctl: error: bad --gpus 'nothing': use indices like 0,1, a range "
                                           "like 0-7, or none")


@pytest.mark.parametrize("args", [
    ["launch", "local", "--gpus", "\u00b2", "--", "true"],
    ["launch", "local", "--gpus", "0-\u00b3", "--", "true"],
    ["launch", "local", "--gpus", "\u2460", "--", "true"],
    ["launch", "local", "--gpus", "\u0663", "--", "true"],  # int() reads it as 3
    ["ps", "pve1/\u00b2"],
], ids=["superscript", "range-to-superscript", "circled", "arabic-indic", "ps-superscript-ctid"])
def test_a_number_in_unicode_digits_is_exit_2_in_one_line(tmp_path, args):
    (tmp_path / "inventory.yaml").write_text("hosts:\n  pve1:\n    address: 192.0.2.1\n    containers:\n"
                                             "      300: {gpus: 4}\n  local:\n    transport: local\n")
    done = dflashctl(tmp_path, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.stderr.startswith("dflashctl: error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ("bad --gpus" if "--gpus" in args else "must be a number") in done.stderr


def test_an_inventory_key_in_unicode_digits_is_exit_2_naming_file_line_and_field(tmp_path):
    (tmp_path / "inventory.yaml").write_text("hosts:\n  pve1:\n    address: 192.0.2.1\n    containers:\n"
                                             "      \"\u00b2\": {gpus: 4}\n")
    done = dflashctl(tmp_path, "ps")
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.stderr.strip() == (f"dflashctl: error: {tmp_path / 'inventory.yaml'}:5: hosts.pve1.containers.\u00b2: "
                                   "a container id must be an integer CTID (digits 0-9), got '\u00b2'")


def test_a_reset_during_the_ssh_banner_is_one_error_line_and_exit_3(tmp_path):
    """paramiko's transport thread logs the reset with a traceback; only dflashctl's line may reach the user."""
    from tests.resetting_server import SSH_BANNER_START, inventory_text, resetting_server

    with resetting_server(SSH_BANNER_START) as port:
        (tmp_path / "inventory.yaml").write_text(inventory_text(port))
        done = dflashctl(tmp_path, "ps", "h")
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("dflashctl: error: h: ") and len(done.stderr.splitlines()) == 1, done.stderr


def test_bare_dflashctl_shows_the_help_and_exits_2(tmp_path):
    done = dflashctl(tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "launch" in done.stdout and "Usage" in done.stdout
    assert done.stderr.strip() == "dflashctl: error: no command given (one of the commands above)"


COMMANDS = ["doctor", "launch", "ps", "logs", "kill", "cleanup", "watch", "demo", "version", "sweep"]


@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS), ["sweep", "report"]],
                         ids=["root", *COMMANDS, "sweep-report"])
def test_help_shows_the_names_given_not_the_parsers_type_names(tmp_path, command):
    """Whatever typer the install resolved: no `<str>`, `<bool>`, `<list[str]>`, `<float range> [x>=0]` beside
    the options, no `{TARGET}` in the usage line."""
    done = dflashctl(tmp_path, *command, "--help")
    assert done.returncode == 0, done.stderr
    usage = next(line for line in done.stdout.splitlines() if "Usage:" in line)
    assert "{" not in usage, usage
    for noise in ("<str>", "<bool>", "<int>", "<float>", "<list", "range", "[x>=", "<=x", "BOOLEAN", "TEXT",
                  "INTEGER", "FLOAT"):
        assert noise not in done.stdout, (noise, done.stdout)


def test_help_version_and_ps_on_local_work(tmp_path):
    done = dflashctl(tmp_path, "--help")
    assert done.returncode == 0 and "launch" in done.stdout
    done = dflashctl(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.startswith("dflashctl ") and "agent" in done.stdout
    done = dflashctl(tmp_path, "ps")
    assert done.returncode == 0 and "no runs" in done.stdout, done.stderr
    done = dflashctl(tmp_path, "version", "--json")
    assert done.returncode == 0 and '"agent_version"' in done.stdout


def test_every_controller_command_runs_from_the_installed_script(tmp_path):
    """What the controller-only install must run: launch, ps, logs, kill by name, doctor, watch, cleanup."""
    from tests.lab.workloads import stop_keeper

    try:
        done = dflashctl(tmp_path, "launch", "local", "--name", "smoke", "--", "sh", "-c", "echo hi; sleep 60")
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.strip()
        assert run_id.startswith("smoke-")
        done = dflashctl(tmp_path, "logs", "smoke")
        assert done.returncode == 0 and done.stdout.strip() == "hi", done.stderr
        done = dflashctl(tmp_path, "kill", "smoke", "--grace", "1")
        assert done.returncode == 0 and f"{run_id} on local: killed" in done.stdout, done.stderr
        for args in (["doctor", "local"], ["watch", "--once", "--json", "local"], ["cleanup", "local", "--dry-run"]):
            done = dflashctl(tmp_path, *args)
            assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    finally:
        stop_keeper(tmp_path / "data" / "dflashctl" / ".dflash" / "runs")


def _installed_has(module: str) -> bool:
    """Whether the console script's own interpreter can import `module` (an optional extra of the install)."""
    with open(SCRIPT, "rb") as handle:
        shebang = handle.readline().decode(errors="replace")
    python = shebang[2:].strip().split() if shebang.startswith("#!") else ["python3"]
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([*python, "-c", probe], cwd="/", timeout=60).returncode == 0


@pytest.mark.parametrize("args, words", [
    (["watch", "--serve", "--headless", "local"], "do not go with it"),
    (["watch", "--once", "--notify", "json://127.0.0.1:9/hook", "local"], "needs a live watch, not --once"),
    (["watch", "--port", "9000", "local"], "go with --serve"),
    (["watch", "--notify", "json://127.0.0.1:9/hook", "--no-notify", "local"], "contradict"),
])
def test_watch_option_mistakes_from_the_installed_script(tmp_path, args, words):
    done = dflashctl(tmp_path, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.stderr.startswith("dflashctl: error: ") and words in done.stderr, done.stderr


def test_a_missing_extra_is_one_line_with_its_install_hint(tmp_path):
    """The controller-only install has neither apprise nor textual-serve: asking for them says how to get them."""
    checked = 0
    for module, args, hint in (("textual_serve", ["watch", "--serve", "local"], "dflashctl[serve]"),
                               ("apprise", ["watch", "--headless", "--notify", "json://127.0.0.1:9/hook", "local"],
                                "dflashctl[notify]")):
        if _installed_has(module):
            continue   # this install has the extra: the command would run, not refuse
        done = dflashctl(tmp_path, *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert hint in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        checked += 1
    if not checked:
        pytest.skip("this install has both the serve and the notify extras")


def in_shell(tmp_path, shell: str, script: str) -> subprocess.CompletedProcess:
    """`script` run by `shell` (so that it is the shell dflashctl finds among its parents), with HOME in tmp_path
    and `dflashctl` on PATH naming the script under test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "dflashctl").exists():
        (bin_dir / "dflashctl").symlink_to(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASHCTL_INVENTORY", "_DFLASHCTL_COMPLETE")}
    env.update(HOME=str(tmp_path), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", SHELL=f"/bin/{shell}")
    # `; :` after the command keeps the shell from exec-ing it: the shell stays its parent
    return subprocess.run([shell, "-c", f"{script}; :"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_install_completion_writes_a_bash_script_that_completes_commands_and_options(tmp_path):
    done = in_shell(tmp_path, "bash", "dflashctl --install-completion && echo rc=$?")
    assert "rc=0" in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
    installed = tmp_path / ".bash_completions" / "dflashctl.sh"
    assert installed.is_file() and str(installed) in (tmp_path / ".bashrc").read_text()
    # what bash does on TAB: the script's function, asking dflashctl with the words typed so far
    complete = f"source {installed}; COMP_WORDS=(dflashctl {{words}}); COMP_CWORD={{n}}; " \
               "_dflashctl_completion dflashctl; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    done = in_shell(tmp_path, "bash", complete.format(words="la", n=1))
    assert done.stdout.split() == ["launch"], done.stdout + done.stderr
    done = in_shell(tmp_path, "bash", complete.format(words="launch --restart", n=2))
    assert done.stdout.split() == ["--restart", "--restart-backoff"], done.stdout + done.stderr


def test_completion_in_a_shell_it_cannot_serve_is_a_usage_error_naming_it(tmp_path):
    done = in_shell(tmp_path, "sh", "dflashctl --show-completion; echo rc=$?")
    assert done.stdout == "rc=2\n" and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert done.stderr.startswith("dflashctl: error: ") and "'sh'" in done.stderr.splitlines()[0], done.stderr
    assert "bash, zsh, fish and PowerShell" in done.stderr and "Usage: dflashctl" in done.stderr
