"""doctor: for real on this machine (no NPU), and its NPU branch against a fake torch_npu."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.doctor.command import FAIL, FLUX_LAYOUT, PASS, SKIP, DoctorOptions, format_report, run_checks
from dancegrpo_npu.project import find_project
from dancegrpo_npu.doctor.versions import base_version, table_row
from dancegrpo_npu.doctor.checks import torch_npu_suggestion

FAKE_NPU = Path(__file__).parents[1] / "fake_npu"


def flux_weights(tree: Path) -> None:
    """An empty FLUX.1-dev-shaped directory: the weights check reads the layout, not the tensors."""
    flux = tree / "data" / "flux"
    for part in FLUX_LAYOUT:
        (flux / part).mkdir(parents=True, exist_ok=True) if "." not in part else (flux / part).write_text("{}")


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "proj"))
    flux_weights(project.workdir)
    return project


def by_name(checks):
    return {c.name: c for c in checks}


def test_doctor_for_real_on_this_machine_passes(project, capsys):
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is loaded in this process")
    rc = main(["-C", str(project.root), "doctor", "--min-free-gb", "0.001"])
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


def test_doctor_json(project, capsys):
    assert main(["-C", str(project.root), "doctor", "--json", "--skip", "all_reduce", "--min-free-gb", "0"]) == 0
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


def test_version_helpers():
    assert base_version("2.7.1+cpu") == base_version("2.7.1.post2") == base_version("2.7.1rc1") == "2.7.1"
    assert table_row("2.7.1.post2") == ("2.7.1.post2", "2.7.1", "8.5.0") and table_row("9.9.9") is None


# ---------------------------------------------------------------- NPU branch, fake torch_npu


@pytest.fixture
def fake_npu(tmp_path, monkeypatch):
    """The fake torch_npu on sys.path (and in PYTHONPATH for child processes), fake CANN dirs."""
    monkeypatch.syspath_prepend(str(FAKE_NPU))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    import torch

    monkeypatch.setattr(torch, "npu", None, raising=False)  # restored after the test
    cann = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    (cann / "x86_64-linux").mkdir(parents=True)
    (cann / "aarch64-linux").mkdir(parents=True)
    for arch in ("x86_64-linux", "aarch64-linux"):
        (cann / arch / "ascend_toolkit_install.info").write_text(
            "package_name=Ascend-cann-toolkit\nversion=8.2.RC1\ninnerversion=V100R001C22\n"
        )
    driver = tmp_path / "driver_version.info"
    driver.write_text("Version=25.0.rc1.1\nascendhal_version=7.35.23\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(8):
        (dev / f"davinci{i}").write_text("")
    yield {"cann": cann, "driver": driver, "dev": dev}
    sys.modules.pop("torch_npu", None)


def npu_options(fake, **kw):
    environ = {"ASCEND_TOOLKIT_HOME": str(fake["cann"]), "PATH": "/usr/bin:/bin"}
    environ.update(kw.pop("environ", {}))
    return DoctorOptions(environ=environ, dev_dir=fake["dev"], driver_file=fake["driver"], min_free_gb=0, **kw)


@pytest.mark.fake_npu
def test_fake_is_a_fake(fake_npu):
    import torch_npu

    assert torch_npu.__fake__ is True and "NOT Huawei's torch_npu" in torch_npu.__doc__


@pytest.mark.fake_npu
def test_npu_branch_finds_torch_npu_cann_and_devices(project, fake_npu, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,3")
    opts = npu_options(fake_npu, environ={"ASCEND_RT_VISIBLE_DEVICES": "2,3"}, skip=("all_reduce",))
    checks = by_name(run_checks(project, opts))
    assert checks["torch_npu"].status == PASS and "matches torch" in checks["torch_npu"].detail
    assert (
        checks["cann"].status == PASS
        and "CANN 8.2.RC1" in checks["cann"].detail
        and "driver 25.0.rc1.1" in checks["cann"].detail
    )
    assert checks["devices"].status == PASS
    assert checks["devices"].detail.startswith("2 NPU(s) (ASCEND_RT_VISIBLE_DEVICES=2,3): 0: Ascend910B3 64 GiB")
    assert checks["accelerate"].status == PASS and "hccl" in checks["accelerate"].detail
    # The fake has no kernels: the compute check must report that, with its fix, not crash.
    assert checks["matmul"].status == FAIL and "npu:0" in checks["matmul"].detail and "npu-smi" in checks["matmul"].fix
    assert "training can start" not in format_report(list(checks.values()))


@pytest.mark.fake_npu
def test_npu_branch_all_reduce_runs_hccl_workers_and_reports_their_failure(project, fake_npu, monkeypatch):
    """The workers are real child processes that import the fake; HCCL cannot work with it."""
    monkeypatch.setenv("FAKE_NPU_COUNT", "2")
    opts = npu_options(fake_npu, environ={"FAKE_NPU_COUNT": "2"}, skip=("matmul",), timeout=120)
    checks = by_name(run_checks(project, opts))
    assert checks["devices"].detail.startswith("2 NPU(s)")
    ar = checks["all_reduce"]
    assert ar.status == FAIL and ar.detail.startswith("hccl all_reduce, rank 0:") and "fake torch_npu" in ar.detail
    assert "HCCL_CONNECT_TIMEOUT" in ar.fix


@pytest.mark.fake_npu
def test_npu_branch_version_mismatch(project, fake_npu, monkeypatch):
    monkeypatch.setenv("FAKE_TORCH_NPU_VERSION", "2.1.0.post13")
    checks = by_name(run_checks(project, npu_options(fake_npu, skip=("matmul", "all_reduce"))))
    c = checks["torch_npu"]
    assert c.status == FAIL and "built for torch 2.1.0" in c.detail and "install the pair" in c.fix


@pytest.mark.fake_npu
def test_npu_branch_without_set_env(project, fake_npu):
    opts = DoctorOptions(
        environ={"PATH": "/usr/bin"},
        dev_dir=fake_npu["dev"],
        driver_file=fake_npu["driver"],
        min_free_gb=0,
        skip=("matmul", "all_reduce"),
    )
    c = by_name(run_checks(project, opts))["cann"]
    assert c.status == FAIL and "set_env.sh" in c.fix


@pytest.mark.fake_npu
def test_npu_branch_visible_device_that_does_not_exist(project, fake_npu, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,9")
    opts = npu_options(fake_npu, environ={"ASCEND_RT_VISIBLE_DEVICES": "0,9"}, skip=("matmul", "all_reduce"))
    c = by_name(run_checks(project, opts))["devices"]
    assert c.status == FAIL and "names device 9; this host shows 8 NPU(s)" in c.detail


def test_device_npu_requested_without_npu_stack(project):
    if "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is loaded in this process")
    checks = by_name(run_checks(project, DoctorOptions(device="npu", skip=("matmul", "all_reduce"), min_free_gb=0)))
    assert checks["torch_npu"].status == FAIL and checks["devices"].status == FAIL
    import torch

    assert checks["torch_npu"].fix == torch_npu_suggestion(torch.__version__)  # for the torch installed here


def test_torch_npu_suggestion_matches_the_installed_torch():
    assert torch_npu_suggestion("2.8.0+cpu").startswith("pip install torch-npu==2.8.0.post2 (built for your torch 2.8.0, ")
    assert torch_npu_suggestion("2.1.0").startswith("pip install torch-npu==2.1.0.post17 ")
    none = torch_npu_suggestion("2.14.1+cu130")  # no torch_npu is built for it: no "matching" wheel is named
    assert none.startswith("Ascend has no torch_npu for torch 2.14.1+cu130 (its table covers torch 2.1.0, 2.5.1, ")
    assert "install the pair torch==2.7.1 and torch-npu==2.7.1" in none and "matching" not in none
