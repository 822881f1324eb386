"""doctor: for real on this machine (no NPU), and its NPU branch against a fake torch_npu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.doctor.report import FAIL, PASS, SKIP, Check, DoctorOptions, format_report, run_checks
from dancegrpo_npu.project import find_project

FAKES = Path(__file__).resolve().parents[1] / "fakes"
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    return find_project(make_project(tmp_path / "proj"))  # with the FLUX trainers' inputs, as launch checks them


def by_name(checks):
    return {c.name: c for c in checks}


def test_doctor_for_real_on_this_machine_passes(project, capsys):
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is loaded in this process")
    # the LoRA trainer: its resume checkpoint is small, so the disk check asks for --min-free-gb alone
    rc = main(["-C", str(project.root), "doctor", "--min-free-gb", "0.001", "--trainer", "flux-lora"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "0 failed" in out and "training can start" in out
    assert "SKIP  torch_npu" in out and "no NPU stack on this machine" in out
    assert "PASS  all_reduce" in out and "PASS  matmul" in out and "PASS  weights" in out


def test_doctor_real_checks_details(project):
    checks = by_name(run_checks(project, DoctorOptions(min_free_gb=0.001)))
    kind = "cuda" if "CUDA GPU" in checks["devices"].detail else "cpu"
    backend = {"cuda": "nccl", "cpu": "gloo"}[kind]
    assert checks["devices"].status == PASS and "no NPU" in checks["devices"].detail
    assert checks["all_reduce"].status == PASS and checks["all_reduce"].detail.startswith(f"{backend} all_reduce")
    assert checks["cann"].status == SKIP


def test_doctor_fails_with_fixes_and_exit_code(tmp_path, monkeypatch, capsys):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "p", weights=False))
    rc = main(["-C", str(project.root), "doctor", "--min-free-gb", "1e9", "--skip", "all_reduce", "--skip", "matmul"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  disk" in out and "FAIL  weights" in out and out.count("fix:") == 2
    assert "SKIP  all_reduce  skipped by --skip" in out


def test_doctor_missing_tree(tmp_path):
    project = find_project(make_project(tmp_path / "p"), workdir=tmp_path / "none")
    checks = by_name(run_checks(project, DoctorOptions(skip=("matmul", "all_reduce"))))
    assert checks["tree"].status == FAIL and "fetch && dancegrpo-npu apply" in checks["tree"].fix
    # the weights are not blamed on the dependency sets: there is no tree to read the trainers from
    assert checks["weights"].status == SKIP and "no patched tree at" in checks["weights"].detail


def test_doctor_json(project, capsys):
    assert main(["-C", str(project.root), "doctor", "--json", "--skip", "all_reduce", "--min-free-gb", "0",
                 "--trainer", "flux-lora"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in data][:3] == ["python", "torch", "torch_npu"]


def test_matmul_check_is_independent_of_the_kernel_it_checks(monkeypatch):
    """On CPU the device's matmul is the CPU's: the check must compare it with something
    computed without it, so a wrong kernel (1% off here) fails it."""
    torch = pytest.importorskip("torch")
    from dancegrpo_npu.doctor.checks import Facts
    from dancegrpo_npu.doctor.compute import check_matmul, reference_product

    facts = Facts(torch=torch, kind="cpu", count=1)
    good = check_matmul(facts)
    assert good.status == PASS and "agrees with a float64 sum of products" in good.detail

    a, b = torch.randn(64, 48, dtype=torch.float64), torch.randn(48, 40, dtype=torch.float64)
    assert torch.allclose(reference_product(torch, a, b), a @ b, rtol=0, atol=1e-12)

    real = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda x, y: real(x, y) * 1.01)
    wrong = check_matmul(facts)
    assert wrong.status == FAIL and "matmul on cpu is off by" in wrong.detail and wrong.fix


# ---------------------------------------------------------------- NPU branch, fake torch_npu
# doctor runs in a child process: the fake registers the "npu" device with torch, which cannot
# be undone, and torch imports it inside `import torch` (its entry point), as the real one.

DOCTOR_IN_CHILD = r"""
import json, sys
from pathlib import Path
from dancegrpo_npu.doctor.report import DoctorOptions, run_checks
kw = json.loads(sys.argv[1])
if kw.get("torch_version"):  # the table check reads the versions the two modules report
    import torch, torch_npu
    torch.__version__ = kw["torch_version"]
    torch_npu.__version__ = kw["torch_npu_version"]
opts = DoctorOptions(environ=kw["environ"], dev_dir=Path(kw["dev"]), driver_file=Path(kw["driver"]), min_free_gb=0,
                     device=kw["device"], skip=tuple(kw["skip"]) + ("disk", "tree", "weights"), timeout=120)
print(json.dumps([c.__dict__ for c in run_checks(None, opts)]))
"""


@pytest.fixture
def fake_npu(tmp_path):
    """A CANN 9.1.0 install (CANN 8.5 and newer's layout, with its set_env.sh), a driver file and
    /dev/davinci0-7 for the FAKE torch_npu (tests/fakes)."""
    cann = tmp_path / "Ascend" / "cann"
    for arch in ("x86_64-linux", "aarch64-linux"):
        (cann / arch).mkdir(parents=True)
        (cann / arch / "ascend_toolkit_install.info").write_text(
            "package_name=Ascend-cann-toolkit\nversion=9.1.0\ninnerversion=V100R001C26\n"
        )
    (cann / "set_env.sh").write_text("export ASCEND_HOME_PATH=/usr/local/Ascend/cann\n")
    driver = tmp_path / "driver_version.info"
    driver.write_text("Version=25.0.rc1.1\nascendhal_version=7.35.23\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(8):
        (dev / f"davinci{i}").write_text("")
    return {"cann": cann, "driver": driver, "dev": dev, "tmp": tmp_path}


def doctor_with_fake(fake, environ=None, skip=("matmul", "all_reduce", "numerics"), device="auto", cann=True,
                     versions=None):
    """doctor's stack checks in a child process that has the FAKE torch_npu installed.  ``versions``:
    (torch, torch_npu) for the modules to report, where a test needs a pair of the table."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FAKE_TORCH_NPU_DEVICES": "8",
           "PYTHONPATH": os.pathsep.join([str(FAKES), str(SRC)]),
           "DANCEGRPO_ASCEND_BASES": str(fake["tmp"] / "Ascend"), **(environ or {})}
    if cann:
        env["ASCEND_TOOLKIT_HOME"] = str(fake["cann"])
    kw = {"environ": env, "dev": str(fake["dev"]), "driver": str(fake["driver"]), "skip": list(skip), "device": device}
    if versions:
        kw["torch_version"], kw["torch_npu_version"] = versions
    proc = subprocess.run([sys.executable, "-c", DOCTOR_IN_CHILD, json.dumps(kw)], env=env, cwd=fake["tmp"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {c["name"]: Check(**{**c, "notes": tuple(c["notes"])}) for c in json.loads(proc.stdout.splitlines()[-1])}


@pytest.mark.fake_npu
def test_npu_branch_finds_torch_npu_cann_and_devices(fake_npu):
    checks = doctor_with_fake(fake_npu, {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}, skip=("all_reduce", "numerics"),
                              versions=("2.10.0+cpu", "2.10.0.post6"))
    assert checks["torch_npu"].status == PASS and "matches torch" in checks["torch_npu"].detail
    assert (
        checks["cann"].status == PASS
        and "CANN 9.1.0" in checks["cann"].detail
        and "driver 25.0.rc1.1" in checks["cann"].detail
        and "torch_npu 2.10.0.post6 is a wheel of this CANN's row" in checks["cann"].detail
    )
    assert checks["visible"].status == PASS
    assert checks["devices"].status == PASS
    assert checks["devices"].detail.startswith("2 NPU(s) (ASCEND_RT_VISIBLE_DEVICES=2,3): 0: Ascend910B3 64 GiB")
    # under transfer_to_npu init_process_group rewrites nccl to hccl: no accelerate version is refused
    assert checks["accelerate"].status == PASS and "nccl to hccl" in checks["accelerate"].detail
    # The fake has no kernels: the compute check must report that, with its fix, not crash.
    assert checks["matmul"].status == FAIL and "npu:0" in checks["matmul"].detail and "npu-smi" in checks["matmul"].fix
    assert "training can start" not in format_report(list(checks.values()))


@pytest.mark.fake_npu
def test_npu_branch_all_reduce_runs_hccl_workers_and_reports_their_failure(fake_npu):
    """The workers are real child processes that import the fake; HCCL cannot work with it."""
    checks = doctor_with_fake(fake_npu, {"FAKE_TORCH_NPU_DEVICES": "2"}, skip=("matmul", "numerics"))
    assert checks["devices"].detail.startswith("2 NPU(s)")
    ar = checks["all_reduce"]
    assert ar.status == FAIL and ar.detail.startswith("hccl all_reduce, rank 0:") and "hccl" in ar.detail[24:]
    assert "HCCL_CONNECT_TIMEOUT" in ar.fix


@pytest.mark.fake_npu
def test_npu_branch_version_mismatch(fake_npu):
    c = doctor_with_fake(fake_npu, {"FAKE_TORCH_NPU_VERSION": "2.1.0.post13"})["torch_npu"]
    assert c.status == FAIL and "built for torch 2.1.0" in c.detail
    assert c.fix.startswith("install torch==2.10.0 torch-npu==2.10.0.post6 (the CPU build of torch; ")


@pytest.mark.fake_npu
def test_npu_branch_without_set_env(fake_npu):
    c = doctor_with_fake(fake_npu, cann=False)["cann"]
    assert c.status == FAIL and "set_env.sh" in c.fix


@pytest.mark.fake_npu
def test_missing_cann_libraries_are_not_a_broken_torch(fake_npu):
    """Without set_env.sh `import torch` itself fails (autoload); doctor says what to source, and how
    to work on the CPU on this host."""
    checks = doctor_with_fake(fake_npu, {"FAKE_TORCH_NPU_BROKEN": "1"}, cann=False)
    c = checks["torch"]
    assert c.status == FAIL and c.detail.startswith("CANN's environment is missing: torch_npu does not load "
                                                    "(ImportError: libhccl.so: cannot open shared object file")
    assert f"source {fake_npu['cann'] / 'set_env.sh'}" in c.fix and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in c.fix
    assert "virtualenv without torch_npu" in c.fix
    # CANN's own package check raises a bare Exception: the same verdict, through torch_npu's import
    checks = doctor_with_fake(fake_npu, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
                                         "ASCEND_HOME_PATH": str(fake_npu["tmp"] / "gone")})
    assert checks["torch"].status == PASS
    c = checks["torch_npu"]
    assert c.status == FAIL and c.detail.startswith("CANN's environment is missing: torch_npu does not load "
                                                    f"(Exception: ASCEND_HOME_PATH : {fake_npu['tmp'] / 'gone'}")


@pytest.mark.fake_npu
def test_npu_branch_visible_device_that_does_not_exist(fake_npu):
    c = doctor_with_fake(fake_npu, {"ASCEND_RT_VISIBLE_DEVICES": "0,9"})["visible"]
    assert c.status == FAIL and "names device 9; this host shows 8 NPU(s)" in c.detail


@pytest.mark.fake_npu
@pytest.mark.parametrize("visible, works", [("3,2", "2,3"), ("1,1", "1")])
def test_npu_branch_refuses_a_device_list_torch_npu_counts_as_none(fake_npu, visible, works):
    checks = doctor_with_fake(fake_npu, {"ASCEND_RT_VISIBLE_DEVICES": visible})
    c = checks["visible"]
    assert c.status == FAIL and "torch_npu then sees no NPU at all (device_count() is 0)" in c.detail
    assert c.fix == f"list each NPU once, in ascending order: ASCEND_RT_VISIBLE_DEVICES={works}"
    assert checks["devices"].status == FAIL and checks["devices"].detail == "torch_npu sees no NPU"


@pytest.mark.fake_npu
def test_numerics_self_check_runs_under_the_fake_and_says_it_proves_nothing(fake_npu):
    c = doctor_with_fake(fake_npu, {"DANCEGRPO_DEVICE": "npu"}, skip=("matmul", "all_reduce"), device="npu")["numerics"]
    assert c.status == SKIP and "FAKE torch_npu" in c.detail and "proves nothing" in c.detail
    import torch

    from dancegrpo_npu.doctor.numerics import model_blocks

    names = [n.split(" (")[0].split(None, 1)[1] for n in c.notes]
    blocks = [build(torch, torch.Generator())[0] for build in model_blocks()]  # the blocks the rows name
    assert blocks and {"matmul, HF32 off", "matmul, HF32 on", "conv2d", "softmax", "layer_norm", "npu_rms_norm",
                       "gelu, erf", "gelu, tanh", "scaled_dot_product_attention", "npu_fusion_attention",
                       "RoPE, float32", *blocks, "HPS ViT block"} <= set(names)
    assert all(n.startswith("PASS ") and "msprobe" in n for n in c.notes), c.notes  # CPU against CPU


def test_device_npu_requested_without_npu_stack(project):
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is loaded in this process")
    checks = by_name(run_checks(project, DoctorOptions(device="npu", skip=("matmul", "all_reduce"), min_free_gb=0)))
    assert checks["torch_npu"].status == FAIL and checks["devices"].status == FAIL
    assert checks["torch_npu"].fix.startswith("no CANN on this host: install CANN first")


def test_numerics_warns_where_the_npu_side_differs_and_says_what_it_means(monkeypatch):
    """The comparison itself, on the CPU: an "NPU" npu_gelu that computes the tanh form for
    approximate='none' (the documented native-GELU trap) is a WARN with its meaning; the ops
    computed alike PASS."""
    import types

    import torch

    from dancegrpo_npu.doctor.numerics import run_numerics

    F = torch.nn.functional
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(matmul=types.SimpleNamespace(allow_hf32=False)),
                        raising=False)
    npu_ops = types.SimpleNamespace(
        npu_gelu=lambda x, approximate="none": F.gelu(x, approximate="tanh"),
        npu_rms_norm=lambda x, w, epsilon=1e-6: ((x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True)
                                                                          + epsilon)).to(x.dtype) * w, None),
        npu_fusion_attention=lambda q, k, v, n, layout, scale=1.0: (F.scaled_dot_product_attention(q, k, v, scale=scale),),
    )
    results = {(r.name, r.dtype): r for r in run_numerics(torch, npu_ops, "cpu")}
    trap = results[("gelu, erf (npu_gelu 'none')", "float32")]
    assert trap.status == "WARN" and trap.max_rel > 1e-2 and "DANCEGRPO_NPU_GELU" in trap.line()
    assert "2 x msprobe api_accuracy_checker StandardConfig._rtol[float32]" in trap.line()
    others = [r for key, r in results.items() if key != ("gelu, erf (npu_gelu 'none')", "float32")]
    assert others and all(r.status == "PASS" for r in others), [r.line() for r in others if r.status != "PASS"]


@pytest.mark.parametrize("args", [["--timeout", "0"], ["--timeout", "-5"], ["--timeout", "nan"], ["--timeout", "inf"],
                                  ["--min-free-gb", "-1"], ["--min-free-gb", "nan"], ["--min-free-gb", "inf"]])
def test_a_timeout_or_free_space_that_means_nothing_is_one_line(project, capsys, args):
    assert main(["-C", str(project.root), "doctor", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"argument {args[0]}" in err and "Traceback" not in err, err


def test_numerics_under_device_npu_without_an_npu_fails_and_points_at_the_devices_check(project):
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is loaded in this process")
    opts = DoctorOptions(device="npu", skip=("matmul", "all_reduce"), min_free_gb=0)
    c = by_name(run_checks(project, opts))["numerics"]
    assert c.status == FAIL and "--device npu asks for one" in c.detail and "not an NPU run" not in c.detail
    assert by_name(run_checks(project, DoctorOptions(skip=("matmul", "all_reduce"), min_free_gb=0)))["numerics"].status \
        == SKIP  # auto on a machine without an NPU: not an NPU run


@pytest.mark.parametrize("visible, works", [("3,2", "2,3"), ("1,1", "1"), ("0,2,1,2", "0,1,2")])
def test_a_visible_device_list_torch_npu_counts_as_none_is_named_without_torch_npu(project, visible, works):
    """The rule is the variable's: doctor names it on a host where torch_npu is not installed (yet)."""
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is loaded in this process")
    import importlib.util

    assert importlib.util.find_spec("torch_npu") is None
    opts = DoctorOptions(environ={"ASCEND_RT_VISIBLE_DEVICES": visible}, skip=("matmul", "all_reduce"), min_free_gb=0)
    c = by_name(run_checks(project, opts))["visible"]
    assert c.status == FAIL and "torch_npu then sees no NPU at all" in c.detail
    assert c.fix == f"list each NPU once, in ascending order: ASCEND_RT_VISIBLE_DEVICES={works}"
    good = DoctorOptions(environ={"ASCEND_RT_VISIBLE_DEVICES": "0,1,2"}, skip=("matmul", "all_reduce"), min_free_gb=0)
    assert by_name(run_checks(project, good))["visible"].status == PASS


CANN_CHECK_IN_CHILD = r"""
import json, sys
from pathlib import Path
import torch, torch_npu
from dancegrpo_npu.doctor.report import DoctorOptions, run_checks
kw = json.loads(sys.argv[1])
out = []
for torch_version, npu_version in kw["pairs"]:  # the table check reads the versions the two modules report
    torch.__version__, torch_npu.__version__ = torch_version, npu_version
    opts = DoctorOptions(environ=kw["environ"], dev_dir=Path(kw["dev"]), driver_file=Path(kw["driver"]), min_free_gb=0,
                         skip=("devices", "matmul", "numerics", "all_reduce", "disk", "tree", "weights"))
    out.append({c.name: [c.status, c.detail, c.fix] for c in run_checks(None, opts)}["cann"])
print(json.dumps(out))
"""

# CANN -> (the pair Ascend's table gives it, a pair of another CANN)
CANN_PAIRS = {
    "8.3.RC1": (("2.8.0+cpu", "2.8.0"), ("2.10.0+cpu", "2.10.0.post6")),
    "8.5.0": (("2.9.0+cpu", "2.9.0"), ("2.7.1+cpu", "2.7.1")),
    "9.0.0": (("2.10.0+cpu", "2.10.0"), ("2.10.0+cpu", "2.10.0.post6")),
    "9.1.0": (("2.10.0+cpu", "2.10.0.post6"), ("2.7.1+cpu", "2.7.1")),
    "9.1.1": (("2.7.1", "2.7.1.post10"), ("2.9.0", "2.9.0")),
}
# what the FAIL names for the mismatch: the table's pair of that CANN in the installed torch's line, else its default
CANN_FIX = {"8.3.RC1": "torch==2.8.0 torch-npu==2.8.0", "8.5.0": "torch==2.7.1 torch-npu==2.7.1.post2",
            "9.0.0": "torch==2.10.0 torch-npu==2.10.0", "9.1.0": "torch==2.7.1 torch-npu==2.7.1.post10",
            "9.1.1": "torch==2.9.0 torch-npu==2.9.0.post8"}


@pytest.mark.fake_npu
@pytest.mark.parametrize("version", sorted(CANN_PAIRS))
def test_doctor_checks_the_pair_against_the_hosts_cann(fake_npu, version):
    """Simulated hosts of each CANN (the layout of 8.5 and newer; the version file only differs):
    PASS on the table's pair, FAIL naming the pair to install on another CANN's."""
    for arch in ("x86_64-linux", "aarch64-linux"):
        (fake_npu["cann"] / arch / "ascend_toolkit_install.info").write_text(f"version={version}\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FAKE_TORCH_NPU_DEVICES": "8",
           "PYTHONPATH": os.pathsep.join([str(FAKES), str(SRC)]), "ASCEND_TOOLKIT_HOME": str(fake_npu["cann"]),
           "DANCEGRPO_ASCEND_BASES": str(fake_npu["tmp"] / "Ascend")}
    kw = {"environ": env, "dev": str(fake_npu["dev"]), "driver": str(fake_npu["driver"]), "pairs": CANN_PAIRS[version]}
    proc = subprocess.run([sys.executable, "-c", CANN_CHECK_IN_CHILD, json.dumps(kw)], env=env, cwd=fake_npu["tmp"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (good, bad) = json.loads(proc.stdout.splitlines()[-1])
    assert good[0] == PASS and f"CANN {version}" in good[1] and "is a wheel of this CANN's row" in good[1], good
    assert bad[0] == FAIL and f"Ascend's table does not list torch_npu {CANN_PAIRS[version][1][1]} for CANN {version}" \
        in bad[1], bad
    assert bad[2].startswith(f"install {CANN_FIX[version]} (the CPU build of torch; "), bad


def test_the_disk_check_asks_the_runs_directory_for_one_resume_checkpoint_of_the_largest_trainer(project, tmp_path,
                                                                                                  monkeypatch):
    """Not the project: the runs directory, where checkpoints go; and not 50 GB whatever the trainer."""
    from dancegrpo_npu.doctor import trainers

    need, why = trainers.disk_need(["flux-lora", "wan", "qwenimage"], 50.0)
    assert 230 < need < 260 and why.startswith("one resume checkpoint of qwenimage")  # Qwen-Image's 20 B parameters
    assert trainers.disk_need(["flux-lora"], 50.0) == (50.0, "--min-free-gb")  # LoRA: the floor alone
    assert trainers.disk_need(["wan"], 50.0)[0] == 50.0  # 1.4 B parameters: 17 GiB, under the floor
    runs = tmp_path / "elsewhere" / "runs"
    runs.parent.mkdir()
    from dancegrpo_npu.project import find_project

    moved = find_project(project.root, runs_dir=runs)  # --runs-dir (or DANCEGRPO_RUNS)
    c = by_name(run_checks(moved, DoctorOptions(skip=("matmul", "all_reduce"), min_free_gb=0, trainers=("flux",))))["disk"]
    assert f"free under {runs.parent} (the runs directory, to be made)" in c.detail
    assert "wanted (one resume checkpoint of flux" in c.detail
    monkeypatch.setattr(trainers, "free_gib", lambda path: (1.0, runs.parent))
    c = by_name(run_checks(moved, DoctorOptions(skip=("matmul", "all_reduce"), min_free_gb=0, trainers=("flux",))))["disk"]
    assert c.status == FAIL and "--runs-dir DIR" in c.fix


@pytest.mark.upstream
@pytest.mark.slow  # the trainers' own parsers run in their dependency sets' interpreters
def test_doctor_checks_each_trainers_inputs_and_dependency_set_as_launch_does(patched_tree, monkeypatch):
    """The real tree, no weights: each trainer's missing inputs are named as `launch --dry-run` names
    them; by default every trainer whose set is installed is checked; a missing set is named."""
    from dancegrpo_npu.doctor import trainers

    project = patched_tree.project
    assert trainers.installed(project, dict(os.environ)) == ["flux", "flux-lora", "wan", "qwenimage", "qwenimage-edit", "sd",
                                                             "hunyuan", "skyreels-i2v"]
    opts = DoctorOptions(skip=("matmul", "all_reduce", "disk"), trainers=("wan", "qwenimage"))
    c = by_name(run_checks(project, opts))["weights"]
    assert c.status == FAIL and c.detail.startswith("wan: ") and " | qwenimage: " in c.detail
    assert "Wan2.1-T2V-1.3B weights" in c.detail and "Qwen-Image weights" in c.detail and "FLUX" not in c.detail
    gone = {**os.environ, "DANCEGRPO_VENV_DIFFUSERS_0_35": str(patched_tree.tree / "no-such-venv")}
    c = by_name(run_checks(project, DoctorOptions(skip=opts.skip, trainers=("wan",), environ=gone)))["weights"]
    assert c.status == FAIL and "diffusers-0.35" in c.detail and "bootstrap.sh" in c.detail
    assert "wan" not in trainers.installed(project, gone)
    c = by_name(run_checks(project, DoctorOptions(skip=opts.skip, trainers=("hunyuan", "skyreels-i2v"))))["weights"]
    assert c.status == FAIL and c.detail.startswith("hunyuan: ") and " | skyreels-i2v: " in c.detail
    assert "HunyuanVideo weights" in c.detail and "SkyReels-V1-I2V weights" in c.detail and "VideoAlign" in c.detail


def test_dancegrpo_device_is_doctors_default_device(project, monkeypatch):
    """DANCEGRPO_DEVICE=npu is what training will use: doctor checks for it unless --device says else."""
    from dancegrpo_npu.commands import doctor as doctor_cmd

    seen = []
    monkeypatch.setattr(doctor_cmd, "run_checks", lambda project, opts: seen.append(opts.device) or [])
    monkeypatch.setenv("DANCEGRPO_DEVICE", "npu")
    main(["-C", str(project.root), "doctor"])
    main(["-C", str(project.root), "doctor", "--device", "cpu"])
    monkeypatch.delenv("DANCEGRPO_DEVICE")
    main(["-C", str(project.root), "doctor"])
    assert seen == ["npu", "cpu", "auto"]


@pytest.mark.parametrize("below", [False, True])
def test_a_runs_directory_that_is_a_file_is_refused_in_one_line(project, tmp_path, capsys, below):
    (tmp_path / "runs.txt").write_text("not a directory")
    runs = tmp_path / "runs.txt" / "sub" if below else tmp_path / "runs.txt"
    rc = main(["-C", str(project.root), "doctor", "--runs-dir", str(runs)])
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert rc == 2 and out == "" and f"the runs directory {runs}" in line and "a file, not a directory" in line
    assert "--runs-dir" in line


@pytest.mark.parametrize("names, has, lacks", [
    (("hunyuan",), ["doctor --weights", "--videoalign_ckpt", "--data_json_path"], ["--hps", "--vae_model_path"]),
    (("skyreels-i2v",), ["doctor --weights", "--videoalign_base_model", "--empty_embeddings_dir",
                         "--reference_model_path"], ["--hps", "--vae_model_path"]),
    (("flux",), ["doctor --weights/--hps-ckpt/--hps-open-clip-ckpt", "--data_json_path", "--dit_model_name_or_path"],
     ["--videoalign", "--hps_ckpt", "--vae_model_path"]),
    (("sd",), ["doctor --weights/--hps-ckpt/--hps-open-clip-ckpt", "--prompt_dir"],
     ["--pretrained_model_name_or_path", "--hps_ckpt"]),
])
def test_the_weights_fix_names_the_trainers_own_inputs(project, monkeypatch, names, has, lacks):
    from dancegrpo_npu.doctor import trainers

    monkeypatch.setattr(trainers, "trainer_check", lambda project, name, environ, **kw: ([f"{name}'s input is missing"], None))
    c = by_name(run_checks(project, DoctorOptions(skip=("matmul", "all_reduce", "numerics", "disk"), trainers=names)))
    fix = c["weights"].fix
    assert c["weights"].status == FAIL and "docs/weights.md" in fix
    assert all(word in fix for word in has) and not any(word in fix for word in lacks), fix


def test_doctors_flags_reach_only_the_trainers_that_have_those_inputs(project, monkeypatch, tmp_path):
    from dancegrpo_npu.doctor import trainers
    from dancegrpo_npu.run import launch

    seen = {}

    def plan(project, spec, run_dir, **kw):
        seen[spec.script] = spec.args
        raise trainers.DancegrpoError("stop here")

    monkeypatch.setattr(launch, "build_plan", plan)
    weights, hps, clip = tmp_path / "weights", tmp_path / "hps.pt", tmp_path / "clip.bin"
    for name in ("hunyuan", "skyreels-i2v", "flux", "sd"):
        trainers.trainer_problems(project, name, {}, weights_dir=weights, hps_ckpt=hps, hps_open_clip_ckpt=clip)
    # --weights: the inputs each row marks as its model's own weights (not SkyReels' first-frame pipeline)
    assert seen["hunyuan"] == ("--pretrained_model_name_or_path", str(weights), "--vae_model_path", str(weights))
    assert seen["skyreels-i2v"] == ("--pretrained_model_name_or_path", str(weights), "--vae_model_path", str(weights))
    assert seen["flux"] == ("--pretrained_model_name_or_path", str(weights), "--vae_model_path", str(weights),
                            "--hps_ckpt", str(hps), "--hps_open_clip_ckpt", str(clip))
    assert seen["sd"] == ("--pretrained_model_name_or_path", str(weights), "--hps_ckpt", str(hps),
                          "--hps_open_clip_ckpt", str(clip))


@pytest.mark.parametrize("trainer_args", [[], ["--trainer", "flux", "--trainer", "wan"]])
def test_weights_are_one_trainers_and_need_it_named(project, capsys, trainer_args):
    rc = main(["-C", str(project.root), "doctor", "--weights", "/data/w", *trainer_args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--weights /data/w is one model's weights" in err
    assert "doctor --trainer NAME --weights /data/w" in err


def test_a_refusal_before_the_inputs_is_said_once_with_its_hint_once(project, monkeypatch, capsys):
    """A dry run refused before it looks at the inputs (the tree not verified, say) stops every
    trainer the same way: one entry naming them all, its hint once in the fix, no input advice."""
    from dancegrpo_npu.doctor import trainers

    refusal = trainers.DancegrpoError("the patched tree is not lock + series + overlay", "run `dancegrpo-npu apply`")
    monkeypatch.setattr(trainers, "trainer_check", lambda project, name, environ, **kw: ([], refusal))
    c = by_name(run_checks(project, DoctorOptions(skip=("matmul", "all_reduce", "numerics", "disk"),
                                                  trainers=("flux", "hunyuan"))))["weights"]
    assert c.status == FAIL and c.detail == "flux, hunyuan: the patched tree is not lock + series + overlay", c.detail
    assert c.fix == "run `dancegrpo-npu apply`"
    print(format_report([c]))
    assert capsys.readouterr().out.count("dancegrpo-npu apply") == 1
    # the tree's own check failing with that fix: the weights point at it, the fix is printed once
    from dancegrpo_npu.doctor import report

    monkeypatch.setattr(report, "check_tree", lambda project: Check("tree", FAIL, "the tree differs", refusal.hint))
    checks = run_checks(project, DoctorOptions(skip=("matmul", "all_reduce", "numerics", "disk"), trainers=("flux",)))
    assert by_name(checks)["weights"].fix == "the tree check's fix, above"
    assert format_report(checks).count("dancegrpo-npu apply") == 1
