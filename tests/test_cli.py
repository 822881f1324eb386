"""The CLI shell: help, -C, one-line errors without tracebacks."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "dancegrpo_npu", *args], cwd=cwd, capture_output=True, text=True)


def test_help_lists_verbs():
    r = run("--help")
    assert r.returncode == 0
    assert "series" in r.stdout and "upstream.lock" in r.stdout


def test_each_verb_is_one_module_of_commands():
    """cli lists every module of commands/, once; each registers its verb and runs it in ``run``."""
    import ast

    from dancegrpo_npu import cli

    modules = sorted(p.stem for p in (ROOT / "src" / "dancegrpo_npu" / "commands").glob("*.py") if p.stem != "__init__")
    assert sorted(cli.COMMAND_MODULES) == modules and len(set(cli.COMMAND_MODULES)) == len(modules)
    for name in modules:
        tree = ast.parse((ROOT / "src" / "dancegrpo_npu" / "commands" / f"{name}.py").read_text())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"register", "run"} <= functions, name
    verbs = [line.split()[0] for line in run("--help").stdout.split("positional arguments:")[1].split("options:")[0]
             .splitlines()[2:] if line.startswith("    ") and not line.startswith("     ")]
    assert verbs == [m.replace("_", "-") for m in cli.COMMAND_MODULES]  # one verb each, in the listed order


def test_series_lists_patches_in_order():
    r = run("series")
    assert r.returncode == 0, r.stderr
    names = [line.split()[1] for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
    listed = [n for n in (ROOT / "patches" / "series").read_text().split("\n") if n.strip() and not n.startswith("#")]
    assert names == [n.strip() for n in listed]


def test_not_a_project_is_one_line_error(tmp_path):
    r = run("-C", str(tmp_path), "series")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "no upstream.lock" in r.stderr and "-C DIR" in r.stderr


def test_C_after_the_verb(tmp_path):
    r = run("series", "-C", str(tmp_path))
    assert r.returncode == 2 and "no upstream.lock" in r.stderr


def test_cli_starts_without_torch_or_numpy():
    """Every verb's parser is built at start (``--help``, a usage error): the modules it imports
    leave torch and numpy to the functions that use them (numpy alone is a third of the start)."""
    code = ("import sys; import dancegrpo_npu.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "[]", r.stderr


# ------------------------------------------------------------ `dancegrpo-npu VERB | head`


def _closed_reader(*args, unbuffered: bool):
    """Run the CLI with stdout a pipe whose reader is closed before the first write (as
    `| head` does after its lines): every write to stdout fails with EPIPE, at once when
    unbuffered (PYTHONUNBUFFERED=1), else at the flush."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dancegrpo_npu", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


def _synthetic_applied_project(tmp_path):
    from synthetic_upstream import setup

    s = setup(tmp_path)
    s.apply()
    return s.project.root


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    "args",
    [["series"], ["status"], ["lock"], ["--help"], ["launch", "--help"]],
    ids=["series", "status", "lock", "help", "launch-help"],
)
def test_stdout_closed_by_its_reader_exits_quietly(tmp_path, args, unbuffered):
    if args[0] in ("status", "lock"):
        args = ["-C", str(_synthetic_applied_project(tmp_path)), *args]
        with_reader = run(*args)
        assert with_reader.returncode == 0 and with_reader.stdout, with_reader.stderr  # the verb does print
    rc, err = _closed_reader(*args, unbuffered=unbuffered)
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    # a help longer than the stdout buffer is written during argparse's print too, as unbuffered
    if args[-1] == "--help" and (unbuffered or len(run(*args).stdout.encode()) > io.DEFAULT_BUFFER_SIZE):
        assert rc == 0  # argparse's help swallows its own write error, then exits 0
    else:
        assert rc == 141  # 128 + SIGPIPE, what the shell reports for `git log | head`


def test_status_piped_into_head_in_a_shell(tmp_path):
    root = _synthetic_applied_project(tmp_path)
    script = f'set -o pipefail; "{sys.executable}" -m dancegrpo_npu -C "{root}" status | head -c 1 >/dev/null'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert r.returncode in (0, 141)  # 0 when status wrote everything before head closed the pipe


def test_broken_pipe_not_on_stdout_is_not_hidden(monkeypatch, capsys):
    """Only stdout's reader going away is quiet: a BrokenPipeError from the verb's own pipes
    (stdout here is pytest's capture, not a pipe) is a bug and stays one."""
    import argparse

    from dancegrpo_npu import cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe (a subprocess's stdin)")

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=broken)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    with pytest.raises(BrokenPipeError):
        cli.main([])


# ------------------------------------------------------------ usage errors and Ctrl-C


@pytest.mark.parametrize(
    "args, help_cmd",
    [
        (("compare",), "dancegrpo-npu compare --help"),  # a required argument missing
        (("frobnicate",), "dancegrpo-npu --help"),  # no such verb
        (("--bogus", "status"), "dancegrpo-npu --help"),  # an unknown option
        (("compare", "a", "b", "--steps"), "dancegrpo-npu compare --help"),  # an option without its value
        (("runs", "--no-such-flag"), "dancegrpo-npu --help"),  # left over after the verb: the top parser's error
    ],
)
def test_usage_error_is_one_line_with_a_hint(args, help_cmd):
    r = run(*args)
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("dancegrpo-npu: error: "), r.stderr
    assert f"; see `{help_cmd}`" in r.stderr and "usage:" not in r.stderr
    assert run(*help_cmd.split()[1:]).returncode == 0  # the hinted command works


def _console_script() -> list[str]:
    """The command pip's console script runs: pyproject's entry point, called as the script calls it."""
    import tomllib

    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["dancegrpo-npu"]
    module, func = entry.split(":")
    return [sys.executable, "-c", f"import re, sys\nfrom {module} import {func}\nsys.exit({func}())"]


# SIGINT after each delay: ~immediately (before or while the interpreter starts), while the verbs'
# modules load (the first ~0.2 s), and while the verb runs: `series` on a patches/series that is
# a FIFO nobody writes to blocks in open() until it is interrupted, whenever that comes.
@pytest.mark.parametrize(
    "entry, delays",
    [("python -m", (0.0, 0.05, 0.15, 0.6)), ("console script", (0.0, 0.1, 0.6))],
)
def test_ctrl_c_at_any_moment_is_one_line_and_130(tmp_path, entry, delays):
    import signal
    import time

    from dancegrpo_npu.engine.lock import Lock, save_lock
    from dancegrpo_npu.errors import INTERRUPTED

    save_lock(Lock("https://example.invalid/DanceGRPO", "0" * 40), tmp_path / "upstream.lock")
    (tmp_path / "patches").mkdir()
    os.mkfifo(tmp_path / "patches" / "series")
    cmd = [sys.executable, "-m", "dancegrpo_npu"] if entry == "python -m" else _console_script()
    for delay in delays:
        # a terminal's Ctrl-C reaches a process that does not ignore SIGINT; a suite started in
        # the background (`&` in a script, nohup) ignores it, and a child inherits that
        proc = subprocess.Popen([*cmd, "-C", str(tmp_path), "series"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        # 130, or death by SIGINT (a shell's 130 too): CPython re-raises SIGINT at exit after
        # some interrupted imports
        if err == f"dancegrpo-npu: {INTERRUPTED}\n" and proc.returncode in (130, -signal.SIGINT):
            continue
        # Before the tool's first line runs, a Ctrl-C is the interpreter's own: it dies silently,
        # or with Python's start-up traceback (site, runpy); never with a frame of the tool's code.
        assert delay < 0.5 and "dancegrpo_npu" not in err and (not err or "<frozen" in err), (delay, proc.returncode, err)


def _every_help(capsys) -> dict[str, str]:
    """The --help of the tool and of each verb, as printed."""
    from dancegrpo_npu.cli import COMMAND_MODULES, main

    texts = {}
    for verb in ("", *(m.replace("_", "-") for m in COMMAND_MODULES)):
        with pytest.raises(SystemExit) as stop:
            main([*verb.split(), "--help"])
        assert stop.value.code == 0
        texts[verb or "dancegrpo-npu"] = capsys.readouterr().out
    return texts


def test_no_help_text_shows_raw_markup(capsys):
    """Descriptions taken from module docstrings carry reST (``x``, :func:`x`): none of it is
    printed as such."""
    texts = _every_help(capsys)
    assert len(texts) == 18 and all(texts.values())
    shown = {verb: [line for line in text.splitlines() if "``" in line or re.search(r":(func|mod|class):`", line)]
             for verb, text in texts.items()}
    assert not any(shown.values()), {v: lines for v, lines in shown.items() if lines}
    assert "(its row's `plan`: shapes shipped" in texts["plan"]  # the text itself stays (``plan``)


def test_the_top_level_help_names_every_model(capsys):
    from dancegrpo_npu.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "GRPO post-training for FLUX)" not in out
    assert all(name in out for name in ("FLUX.1-dev", "Qwen-Image", "Qwen-Image-Edit", "Wan2.1-T2V-1.3B", "docs/weights.md"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "(GRPO for FLUX)" not in pyproject and "Wan2.1" in pyproject


def test_the_top_level_help_and_the_package_name_every_trainer_of_the_registry(capsys):
    """The models (each trainer's title) in the description, and every trainer launch runs in the
    usual path's launch line; the package's description names every model too."""
    import tomllib

    from dancegrpo_npu import registry
    from dancegrpo_npu.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    description = out.split("The usual path:")[0]
    titles = {registry.get(name).title for name in registry.trainers()}
    assert all(title in " ".join(description.split()) for title in titles), (titles, description)
    launch = out.split("dancegrpo-npu launch ", 1)[1].split("Weights")[0]
    assert all(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", launch) for name in registry.trainers()), launch
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert all(title.split(" v")[0].split("-T2V")[0] in package for title in titles), package


@pytest.mark.parametrize(
    "argv, meant, help_cmd",
    [
        (["launch", "flux", "--nproc_per_node", "8", "--dry-run"], "--nproc-per-node", "launch"),
        (["launch", "flux", "--dryrun"], "--dry-run", "launch"),
        (["launch", "--dryrun", "flux"], "--dry-run", "launch"),
        (["launch", "flux", "--master_addr=10.0.0.1"], "--master-addr", "launch"),
        (["smoke", "--nproc_per_node", "2"], "--nproc", "smoke"),
        (["runs", "--jsn"], "--json", "runs"),
        (["plan", "qwenimage", "--world_size", "4"], "--world-size", "plan"),
    ],
)
def test_a_mistyped_option_gets_did_you_mean(tmp_path, capsys, argv, meant, help_cmd):
    from dancegrpo_npu.cli import main

    assert main(["-C", str(tmp_path), *argv]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"did you mean {meant}?" in line and f"dancegrpo-npu {help_cmd} --help" in line
    assert "after --, e.g." not in line


def test_a_trainer_flag_before_the_separator_still_says_where_it_goes(tmp_path, capsys):
    from dancegrpo_npu.cli import main

    assert main(["-C", str(tmp_path), "launch", "flux", "--max_train_steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "put the script's own arguments after --" in err


@pytest.mark.parametrize("verb", ["launch", "smoke"])
def test_dancegrpo_device_in_the_environment_is_the_default_device(tmp_path, monkeypatch, capsys, verb):
    """DANCEGRPO_DEVICE=npu is what the user asked for: --device's default follows it (an
    explicit --device wins), and a value that is no device is refused in one line."""
    from dancegrpo_npu.cli import main
    from dancegrpo_npu.commands import launch as launch_cmd
    from dancegrpo_npu.smoke import runner

    (tmp_path / "upstream.lock").write_text((ROOT / "upstream.lock").read_text())
    seen = []

    class Planned(Exception):
        pass

    def stop_launch(project, spec, dry_run=False):
        seen.append(spec.device)
        raise Planned

    def stop_smoke(project, options, *typed):
        seen.append(options.device)
        raise Planned

    monkeypatch.setattr(launch_cmd, "launch", stop_launch)
    monkeypatch.setattr(runner, "resumed_options", stop_smoke)
    argv = ["-C", str(tmp_path), verb] + (["flux", "--dry-run"] if verb == "launch" else [])
    monkeypatch.setenv("DANCEGRPO_DEVICE", "npu")
    with pytest.raises(Planned):
        main(argv)
    with pytest.raises(Planned):
        main([*argv[:3], "--device", "cpu", *argv[3:]])
    monkeypatch.delenv("DANCEGRPO_DEVICE")
    with pytest.raises(Planned):
        main(argv)
    assert seen == ["npu", "cpu", "auto"]
    monkeypatch.setenv("DANCEGRPO_DEVICE", "gpu")
    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "DANCEGRPO_DEVICE=gpu is not a device" in line
