"""The torch / torch_npu pair by the host's CANN: ``bootstrap.sh --print-torch`` on simulated hosts.

A simulated Ascend host is a CANN tree with its version file (in the layout of its CANN: the
``ascend-toolkit/latest`` of 8.3 and older, the ``cann`` and ``cann-<version>`` of 8.5 and newer)
under a base directory (``DANCEGRPO_ASCEND_BASES``), and a fake ``npu-smi`` on PATH.  The pairs
expected here are Ascend's compatibility table, written out by hand from its rows (not read from
the project's data file, which they check).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from interpreters import runnable

from dancegrpo_npu.host import torch_stack

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "scripts" / "bootstrap.sh"

# CANN -> (default pins, --torch 2.7 pins), from Ascend's table (TorchNPU 7.2.0 ... 26.2.0)
EXPECTED = {
    "8.3.RC1": ("torch==2.8.0 torchvision==0.23.0 torch-npu==2.8.0", "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1"),
    "8.5.0": ("torch==2.9.0 torchvision==0.24.0 torch-npu==2.9.0",
              "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post2"),
    "9.0.0": ("torch==2.10.0 torchvision==0.25.0 torch-npu==2.10.0",
              "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post4"),
    "9.1.0": ("torch==2.10.0 torchvision==0.25.0 torch-npu==2.10.0.post6",
              "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post10"),
    "9.1.1": ("torch==2.10.0 torchvision==0.25.0 torch-npu==2.10.0.post6",
              "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post10"),
    "9.2.0": ("torch==2.10.0 torchvision==0.25.0 torch-npu==2.10.0.post7",
              "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post11"),
}
# CANNs no row lists that get a row all the same, with one warning: (pins as above, the row used,
# inside the range Ascend declares for TorchNPU 26.0.x-26.2.x, CANN 8.5.x-9.2.x)
UNTABLED = {
    "9.3.0": (EXPECTED["9.2.0"], "TorchNPU 26.2.0 (CANN 9.2.0)", False),
    "9.2.1": (EXPECTED["9.2.0"], "TorchNPU 26.2.0 (CANN 9.2.0)", True),
    "8.5.1": (EXPECTED["8.5.0"], "TorchNPU 7.3.0 (CANN 8.5.0)", True),
}
# where each CANN puts itself
LAYOUT = {"8.3.RC1": "ascend-toolkit/latest", "8.5.0": "cann", "9.0.0": "cann-9.0.0", "9.1.0": "cann",
          "9.1.1": "cann", "8.2.RC1": "ascend-toolkit/latest", "8.1.RC1": "ascend-toolkit/latest", "9.2.0": "cann", "9.2.1": "cann", "9.3.0": "cann-9.3.0",
          "8.5.1": "cann", "8.4.0": "cann"}


def ascend_host(tmp_path: Path, version: str) -> dict[str, str]:
    """The environment of a simulated Ascend host with CANN ``version`` installed (not sourced)."""
    base = tmp_path / "Ascend"
    root = base / LAYOUT[version]
    info = root / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\ninnerversion=V100R001\n")
    (root.parent if root.name == "latest" else root).joinpath("set_env.sh").write_text("# CANN's\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "npu-smi"
    smi.write_text("#!/bin/sh\necho 'npu-smi 25.0.rc1.1'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "DANCEGRPO_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", DANCEGRPO_ASCEND_BASES=str(base),
               DANCEGRPO_VENV=str(tmp_path / "venv"))  # no virtualenv: bootstrap must create nothing
    return env


def print_torch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(BOOTSTRAP), "--print-torch", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert not Path(env["DANCEGRPO_VENV"]).exists(), "--print-torch created the virtualenv"
    return proc


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_print_torch_gives_the_tables_pair_by_default_and_for_the_27_line(tmp_path, version):
    env = ascend_host(tmp_path, version)
    default, line_27 = EXPECTED[version]
    proc = print_torch(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == default + "\n"
    assert f"CANN {version} (from {tmp_path}" in proc.stderr and "CPU build" in proc.stderr  # says what and why
    proc = print_torch(env, "--torch", "2.7")
    assert (proc.returncode, proc.stdout) == (0, line_27 + "\n"), proc.stderr
    assert "MindSpeed-MM" in proc.stderr
    proc = print_torch({**env, "DANCEGRPO_TORCH": "2.7"})  # the variable says the same
    assert proc.stdout == line_27 + "\n"


def test_the_cann_that_set_env_made_active_wins_over_the_installed_ones(tmp_path):
    env = ascend_host(tmp_path, "9.1.0")
    old = tmp_path / "old" / "ascend-toolkit" / "latest"
    (old / f"{platform.machine()}-linux").mkdir(parents=True)
    (old / f"{platform.machine()}-linux" / "ascend_toolkit_install.info").write_text("version=8.5.0\n")
    proc = print_torch({**env, "ASCEND_HOME_PATH": str(old)})
    assert proc.stdout == EXPECTED["8.5.0"][0] + "\n", proc.stderr


@pytest.mark.parametrize("version", ["8.2.RC1", "8.1.RC1"])
def test_a_cann_without_a_supported_wheel_is_refused_in_one_line_naming_the_rows(tmp_path, version):
    proc = print_torch(ascend_host(tmp_path, version))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"bootstrap.sh: error: CANN {version} (")
    assert "upgrade CANN to 8.3.RC1 or later (rows that list one: CANN 9.2.0, 9.1.x, 9.1.0, 9.0.0, 8.5.0, 8.3.RC1)" \
        in line


@pytest.mark.parametrize("version", sorted(UNTABLED))
def test_a_cann_newer_than_the_table_or_inside_the_declared_range_gets_a_row_and_one_warning(tmp_path, version):
    """A table of releases trails the next release: a CANN newer than its newest row installs
    that row's pair, and so does one between rows inside the range Ascend declares, with one
    warning line saying so."""
    (default, line_27), row, inside = UNTABLED[version]
    env = ascend_host(tmp_path, version)
    for args, pins in (((), default), (("--torch", "2.7"), line_27)):
        proc = print_torch(env, *args)
        assert (proc.returncode, proc.stdout) == (0, pins + "\n"), proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("bootstrap.sh: warning:")]
        assert len(warnings) == 1, proc.stderr
        warning = warnings[0]
        table = torch_stack.load_table()
        assert f"CANN {version} is " in warning and f"as read on {table.read}" in warning and row in warning
        assert ("it is inside the CANN range" if inside else "it is outside the CANN range") in warning
        assert "TorchNPU 26.0.x-26.2.x (8.5.x-9.2.x)" in warning
        assert "DANCEGRPO_TORCH='torch==X torchvision==Y torch-npu==Z' with DANCEGRPO_TORCH_UNCHECKED=1" in warning
    # a pair of the row used may be forced without DANCEGRPO_TORCH_UNCHECKED, another may not
    forced = print_torch({**env, "DANCEGRPO_TORCH": line_27})
    assert (forced.returncode, forced.stdout) == (0, line_27 + "\n"), forced.stderr
    other = print_torch({**env, "DANCEGRPO_TORCH": "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post8"})
    assert other.returncode == 2 and "does not list torch_npu 2.7.1.post8" in other.stderr


def test_a_cann_between_rows_outside_the_declared_range_is_refused_with_how_to_force(tmp_path):
    proc = print_torch(ascend_host(tmp_path, "8.4.0"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "CANN 8.4.0" in proc.stderr and "not in Ascend's table as read on" in proc.stderr
    assert "DANCEGRPO_TORCH_UNCHECKED=1" in proc.stderr


@pytest.mark.parametrize("version", ["9.2.0", *sorted(UNTABLED)])
def test_doctor_agrees_with_bootstrap(tmp_path, version, monkeypatch):
    """doctor's CANN check on the pair bootstrap installs: PASS on a CANN of the table, WARN with
    bootstrap's warning on one it is not in, and its fix for a missing torch_npu is bootstrap's pair."""
    from types import SimpleNamespace

    from dancegrpo_npu.doctor import checks

    env = ascend_host(tmp_path, version)
    root = tmp_path / "Ascend" / LAYOUT[version]
    env["ASCEND_HOME_PATH"] = str(root.parent if root.name == "latest" else root)
    proc = print_torch(env)
    assert proc.returncode == 0, proc.stderr
    pins = dict(p.split("==") for p in proc.stdout.split())
    warning = next((ln[len("bootstrap.sh: warning: "):] for ln in proc.stderr.splitlines()
                    if ln.startswith("bootstrap.sh: warning: ")), None)
    monkeypatch.setitem(sys.modules, "torch_npu", SimpleNamespace(__version__=pins["torch-npu"]))
    facts = checks.Facts(torch=SimpleNamespace(__version__=pins["torch"] + "+cpu"), npu=True)
    opts = checks.DoctorOptions(environ=env, driver_file=tmp_path / "none")
    check = checks.check_cann(facts, opts)
    if warning is None:
        assert check.status == checks.PASS and "is a wheel of this CANN's row" in check.detail, check
    else:
        assert check.status == checks.WARN and warning in check.detail, check
    fix = checks.stack_pair(env)
    assert fix.startswith(f"install torch=={pins['torch']} torch-npu=={pins['torch-npu']} "), fix


def test_an_ascend_host_without_a_cann_version_file_is_refused(tmp_path):
    env = ascend_host(tmp_path, "9.1.0")
    proc = print_torch({**env, "DANCEGRPO_ASCEND_BASES": str(tmp_path / "nowhere")})  # only npu-smi says Ascend
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "this is an Ascend host, but no CANN version file" in proc.stderr and "set_env.sh" in proc.stderr


def test_a_forced_pair_the_table_does_not_list_for_this_cann_is_refused_unless_unchecked(tmp_path):
    env = {**ascend_host(tmp_path, "9.1.0"), "DANCEGRPO_TORCH": "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1"}
    proc = print_torch(env)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    line = proc.stderr.strip()
    assert "Ascend's table does not list torch_npu 2.7.1 for CANN 9.1.0" in line
    assert "torch==2.10.0 torch-npu==2.10.0.post6" in line and "torch==2.7.1 torch-npu==2.7.1.post8" in line
    proc = print_torch({**env, "DANCEGRPO_TORCH_UNCHECKED": "1"})
    assert proc.returncode == 0 and proc.stdout == "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1\n"
    assert "bootstrap.sh: warning: Ascend's table does not list torch_npu 2.7.1" in proc.stderr
    listed = {**env, "DANCEGRPO_TORCH": "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post8"}
    assert print_torch(listed).stdout == "torch==2.7.1 torchvision==0.22.1 torch-npu==2.7.1.post8\n"


def test_a_line_the_cann_lacks_or_the_port_does_not_support_is_refused(tmp_path):
    env = ascend_host(tmp_path, "8.5.0")
    proc = print_torch(env, "--torch", "2.10")
    assert proc.returncode == 2 and "--torch 2.10: no row of CANN 8.5.0 lists a torch_npu 2.10.0" in proc.stderr
    proc = print_torch(env, "--torch=2.12")
    assert proc.returncode == 2 and "choose one of 2.10, 2.9, 2.8, 2.7" in proc.stderr


def test_off_ascend_the_platform_pair_is_unchanged(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "DANCEGRPO_"))}
    env.update(DANCEGRPO_ASCEND_BASES=str(tmp_path / "none"), DANCEGRPO_VENV=str(tmp_path / "venv"))
    if torch_stack.is_ascend_host(env):
        pytest.skip("this machine is an Ascend host")
    proc = print_torch(env)
    want = {"x86_64": "torch==2.14.1 torchvision==0.29.1", "aarch64": "torch==2.9.1 torchvision==0.24.1"}
    assert proc.returncode == 0 and proc.stdout == want[platform.machine()] + "\n"


@pytest.mark.parametrize("python, ok", [("python3.12", True), ("python3.10", True), ("python3.13", False)])
def test_python_312_is_accepted_and_313_refused(tmp_path, python, ok):
    interpreter = runnable(python)
    if interpreter is None:
        pytest.skip(f"{python} is not on this machine")
    env = {**ascend_host(tmp_path, "9.1.0"), "PYTHON": interpreter}
    proc = print_torch(env)
    assert (proc.returncode == 0) == ok, proc.stderr
    if not ok:
        assert "is not Python 3.10, 3.11 or 3.12" in proc.stderr


def test_the_table_is_the_one_the_docs_show():
    """docs/ascend-910b.md's table of rows is this file's data."""
    table = torch_stack.load_table()
    text = (ROOT / "docs" / "ascend-910b.md").read_text()
    shown = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].replace(".", "").isdigit():
            shown.append((cells[0], cells[2], tuple(w.strip() for w in cells[1].split(","))))
    assert shown == [(r.release, r.cann, r.wheels) for r in table.rows]
    assert f"read {table.read}" in text


@pytest.mark.parametrize("where", ["Ascend/ascend-toolkit", "Ascend/cann", "Ascend/cann-9.0.0", "npu/cann",
                                   "npu/ascend-toolkit"])
def test_set_env_sh_is_found_where_each_cann_puts_it(tmp_path, where):
    script = tmp_path / where / "set_env.sh"
    script.parent.mkdir(parents=True)
    script.write_text("# CANN's\n")
    bases = os.pathsep.join(str(tmp_path / b) for b in ("Ascend", "npu"))
    assert torch_stack.set_env_scripts({torch_stack.BASES_ENV: bases}) == [script]
    # with CANN's environment set, the active CANN's own comes first
    active = tmp_path / "active" / "cann"
    active.mkdir(parents=True)
    (active / "set_env.sh").write_text("# CANN's\n")
    assert torch_stack.set_env_scripts({torch_stack.BASES_ENV: bases, "ASCEND_HOME_PATH": str(active)}) == [
        active / "set_env.sh", script]


def test_bootstrap_installs_torchs_cpu_build_then_torch_npu_on_an_ascend_host(tmp_path):
    """What pip is asked for on a simulated CANN 9.1.0 host: torch and torchvision from the CPU
    index alone (PyPI's default torch is a CUDA build, which torch_npu refuses), then torch-npu
    from the usual index, then the port with its npu extra.  pip itself is a stand-in here."""
    env = ascend_host(tmp_path, "9.1.0")
    venv = Path(env["DANCEGRPO_VENV"])
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    stub = venv / "bin" / "python"
    stub.write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m pip" ]; then shift 2; echo "$*" >> {log}; exit 0; fi
case "$*" in *"import torch"*|*ensure_hpsv2_vocab*|*"import tkinter"*) exit 0 ;; esac
exec {sys.executable} "$@"
""")
    stub.chmod(0o755)
    proc = subprocess.run(["bash", str(BOOTSTRAP), "--deps-only"], env={**env, "DANCEGRPO_PIP_ARGS": ""},
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [line.split() for line in log.read_text().splitlines()]
    assert calls[0] == ["--disable-pip-version-check", "install", "-q", "--index-url",
                        "https://download.pytorch.org/whl/cpu", "torch==2.10.0", "torchvision==0.25.0"]
    assert calls[1] == ["--disable-pip-version-check", "install", "-q", "torch-npu==2.10.0.post6"]
    assert calls[2][-2:] == ["-e", ".[train,video,test,msprobe,npu]"]
    assert "TorchNPU 26.1.1 row" in proc.stdout  # it says what it chose and why
    mirror = {**env, "DANCEGRPO_TORCH_INDEX": "http://mirror.invalid/cpu"}
    (venv / ".dancegrpo-npu-setup").unlink()
    log.unlink()
    assert subprocess.run(["bash", str(BOOTSTRAP), "--deps-only"], env=mirror, capture_output=True, timeout=60,
                          cwd=ROOT).returncode == 0
    assert log.read_text().splitlines()[0].split()[3:5] == ["--index-url", "http://mirror.invalid/cpu"]
