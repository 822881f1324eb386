"""host.devices: the devices and package versions a job sees, probed in a child process."""

from __future__ import annotations

import importlib.metadata
import os
import sys

from dancegrpo_npu.host import devices


def test_the_probe_sees_the_device_the_job_asks_for():
    got = devices.probe_devices(dict(os.environ, DANCEGRPO_DEVICE="cpu"))
    assert got["requested"] == "cpu" and got["kind"] == "cpu" and got["count"] == 1
    assert got["torch"].split("+")[0] == importlib.metadata.version("torch").split("+")[0]  # the build tag: torch.__version__ only


def test_a_probe_that_cannot_run_says_why():
    got = devices.probe_devices(dict(os.environ), python=sys.executable + "-missing")
    assert got["error"].startswith("device probe failed: ")


def test_package_versions_are_this_interpreters_or_the_one_asked():
    here = devices.package_versions()
    assert here["torch"] == importlib.metadata.version("torch") and "torch_npu" in here
    assert devices.package_versions(sys.executable) == here  # this interpreter: no child needed
    assert "error" in devices.package_versions(sys.executable + "-missing")


def test_no_nvidia_smi_is_no_driver(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert devices.nvidia_driver() is None
