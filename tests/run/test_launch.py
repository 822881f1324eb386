"""launch: the exact torchrun command and environment, real runs under torchrun, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_tree import make_project, recipe_args, trust_synthetic_tree, write_weights

from dancegrpo_npu.host import ascend

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.run import directory
from dancegrpo_npu.run.fingerprint import trainer_matmul_precision
from dancegrpo_npu.run.launch import LaunchSpec, build_plan, launch
from dancegrpo_npu.run.upstream_args import split_flags

PREPROCESS_DEFAULTS = registry.get("preprocess").defaults

PY = "/opt/py/bin/python"
BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "PYTHONPATH": "/usr/local/Ascend/python/site-packages"}


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    return find_project(make_project(tmp_path / "proj"))


def fake_dev(tmp_path: Path, n: int) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for i in range(n):
        (dev / f"davinci{i}").write_text("")
    (dev / "davinci_manager").write_text("")  # not an NPU: must not be counted
    return dev


def plan_for(project, spec, tmp_path, environ=None, dev=None, cwd=None):
    return build_plan(
        project,
        spec,
        project.runs_dir / "RUN",
        environ=dict(BASE_ENV if environ is None else environ),
        cwd=cwd or tmp_path,
        dev_dir=dev or fake_dev(tmp_path, 0),
        python=PY,
    )


def expected_default_args(tree: Path, run_dir: Path, recipe="8gpus", changes=None, drop=()) -> list[str]:
    """The synthetic recipe's arguments (synthetic_tree.SYNTHETIC_RECIPES), as launch passes them."""
    out = []
    path_flags = {"--pretrained_model_name_or_path", "--vae_model_path", "--cache_dir", "--data_json_path"}
    for flag, value, _ in split_flags(recipe_args(recipe)):
        if flag in drop or flag == "--output_dir":
            continue
        value = (changes or {}).get(flag, value)
        out.append(flag)
        if flag == "--data_json_path" and flag not in (changes or {}):  # FLUX's own dataset (run.datasets)
            value = "data/rl_embeddings/flux/videos2caption.json"
        if value is not None:
            out.append(str(tree / value) if flag in path_flags else value)
    out += ["--hps_open_clip_ckpt", str(tree / "hps_ckpt/open_clip_pytorch_model.bin")]
    out += ["--hps_ckpt", str(tree / "hps_ckpt/HPS_v2.1_compressed.pt")]
    return out


# ------------------------------------------------------------------ exact plans


def test_single_node_command_and_environment_exactly(project, tmp_path):
    spec = LaunchSpec("flux", args=("--max_train_steps", "7"), nproc_per_node=2, master_port=29555, device="cpu")
    plan = plan_for(project, spec, tmp_path)
    tree, run_dir = project.workdir, project.runs_dir / "RUN"
    assert plan.command == (
        PY, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2", "--node_rank", "0",
        "--master_addr", "127.0.0.1", "--master_port", "29555",
        "--log_dir", str(run_dir / "logs" / "torchrun"), "--redirects", "3", "--tee", "3",
        str(tree / "fastvideo/train_grpo_flux.py"),
        # world size 2: the 8-rank recipe scaled, the same 16 prompts and 96 samples an update
        *expected_default_args(tree, run_dir, changes={"--train_batch_size": "8", "--train_sp_batch_size": "8",
                                                       "--gradient_accumulation_steps": "48"},
                               drop={"--max_train_steps"}),
        "--max_train_steps", "7",
        "--output_dir", str(run_dir / "outputs"),
    )  # fmt: skip
    assert [(n, v) for n, v, _ in plan.env_set] == [
        ("PYTHONPATH", f"{tree}:/usr/local/Ascend/python/site-packages"),
        ("DANCEGRPO_DEVICE", "cpu"),
        ("WANDB_MODE", "offline"),
    ]
    assert plan.env == {**BASE_ENV, **{n: v for n, v, _ in plan.env_set}}
    assert plan.profile == "cpu"


def test_two_nodes_on_npu_command_and_environment_exactly(project, tmp_path):
    spec = LaunchSpec(
        "flux", nproc_per_node=8, nnodes=2, node_rank=1, master_addr="10.0.0.1", device="npu", strict=True,
        env=(("HCCL_SOCKET_IFNAME", "eth0"),),
    )  # fmt: skip
    plan = plan_for(project, spec, tmp_path, dev=fake_dev(tmp_path, 8))
    tree, run_dir = project.workdir, project.runs_dir / "RUN"
    assert plan.command[3:16] == (
        "--nnodes", "2", "--nproc_per_node", "8", "--node_rank", "1",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "--log_dir", str(run_dir / "logs" / "torchrun"), "--redirects",
    )  # fmt: skip
    assert plan.command[19:] == (
        str(tree / "fastvideo/train_grpo_flux.py"),
        *expected_default_args(tree, run_dir, recipe="2nodes"),
        "--output_dir",
        str(run_dir / "outputs"),
    )
    assert [(n, v) for n, v, _ in plan.env_set] == [
        ("PYTHONPATH", f"{tree}:/usr/local/Ascend/python/site-packages"),
        ("DANCEGRPO_DEVICE", "npu"),
        ("DANCEGRPO_NPU_STRICT", "1"),
        ("WANDB_MODE", "offline"),
        ("TASK_QUEUE_ENABLE", "2"),
        ("COMBINED_ENABLE", "1"),
        ("CPU_AFFINITY_CONF", "2"),
        ("HCCL_CONNECT_TIMEOUT", "1200"),
        ("HCCL_BUFFSIZE", "800"),
        ("NPU_ASD_ENABLE", "0"),
        ("ACLNN_CACHE_LIMIT", "100000"),
        ("MULTI_STREAM_MEMORY_REUSE", "2"),
        ("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"),
        ("ASCEND_GLOBAL_LOG_LEVEL", "3"),
        ("ASCEND_SLOG_PRINT_TO_STDOUT", "0"),
        ("ASCEND_LAUNCH_BLOCKING", "0"),
        ("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"),
        ("HCCL_SOCKET_IFNAME", "eth0"),
    ]
    assert plan.env == {**BASE_ENV, **{n: v for n, v, _ in plan.env_set}}
    assert plan.profile == "npu" and plan.world_size == 16


def test_user_environment_and_env_flags_override_launch_defaults(project, tmp_path):
    environ = {**BASE_ENV, "HCCL_CONNECT_TIMEOUT": "3600", "WANDB_MODE": "online", "TASK_QUEUE_ENABLE": "1"}
    spec = LaunchSpec(
        "flux",
        nproc_per_node=2,
        device="npu",
        master_port=29502,
        env=(("TASK_QUEUE_ENABLE", "0"), ("ASCEND_RT_VISIBLE_DEVICES", "4,5")),
    )
    plan = plan_for(project, spec, tmp_path, environ=environ, dev=fake_dev(tmp_path, 8))
    got = {n: (v, why) for n, v, why in plan.env_set}
    assert got["HCCL_CONNECT_TIMEOUT"][0] == "3600" and got["HCCL_CONNECT_TIMEOUT"][1].startswith("your environment")
    assert got["WANDB_MODE"][0] == "online"
    assert got["TASK_QUEUE_ENABLE"] == ("0", "--env")
    assert got["ASCEND_RT_VISIBLE_DEVICES"] == ("4,5", "--env")
    assert plan.env["HCCL_BUFFSIZE"] == "800"


def test_auto_device_without_npu_sets_no_npu_environment(project, tmp_path):
    plan = plan_for(project, LaunchSpec("flux", master_port=29501), tmp_path)
    assert plan.profile == "auto"
    assert not any(n.startswith(("HCCL", "ASCEND", "TASK_QUEUE")) for n, _, _ in plan.env_set)


def test_paths_user_relative_to_cwd_defaults_relative_to_tree(project, tmp_path):
    here = tmp_path / "here"
    write_weights(here / "weights" / "flux")
    spec = LaunchSpec(
        "flux",
        args=(
            "--pretrained_model_name_or_path",
            "weights/flux",
            "--vae_model_path=weights/flux",
            "--output_dir",
            "ckpt",
        ),
        master_port=29501,
    )
    plan = plan_for(project, spec, tmp_path, cwd=here)
    args = list(plan.script_args)
    assert args[args.index("--pretrained_model_name_or_path") + 1] == str(here / "weights" / "flux")
    assert f"--vae_model_path={here / 'weights' / 'flux'}" in args
    assert args[args.index("--output_dir") + 1] == str(here / "ckpt") and args.count("--output_dir") == 1
    assert args[args.index("--data_json_path") + 1] == str(project.workdir / "data/rl_embeddings/flux/videos2caption.json")


def test_hub_id_is_left_for_the_script(project, tmp_path):
    spec = LaunchSpec("flux", args=("--pretrained_model_name_or_path", "black-forest-labs/FLUX.1-dev"), master_port=29501)
    args = list(plan_for(project, spec, tmp_path).script_args)
    assert args[args.index("--pretrained_model_name_or_path") + 1] == "black-forest-labs/FLUX.1-dev"


def test_without_upstream_defaults_only_the_given_args_and_output_dir(project, tmp_path):
    spec = LaunchSpec("flux-lora", args=("--h", "64", "--cfg", "-1"), upstream_defaults=False, master_port=29501)
    plan = plan_for(project, spec, tmp_path)
    assert plan.script_args == ("--h", "64", "--cfg", "-1", "--output_dir", str(project.runs_dir / "RUN" / "outputs"))
    assert plan.script_path == project.workdir / "fastvideo/train_grpo_flux_lora.py"


def test_preprocess_keeps_its_output_in_the_tree(project, tmp_path):
    plan = plan_for(project, LaunchSpec("preprocess", master_port=29501), tmp_path)
    tree = project.workdir
    # upstream's script's values, but FLUX's own dataset directory (run.datasets) for its output
    own = {"--output_dir": "data/rl_embeddings/flux"}
    assert plan.script_args == tuple(
        x for flag, value in PREPROCESS_DEFAULTS for x in (flag, str((tree / own.get(flag, value)).resolve()))
    )


# ------------------------------------------------------------------ bad input, refused before torchrun


@pytest.mark.parametrize(
    "spec, dev_n, message",
    [
        (LaunchSpec("flux-xl"), 0, "unknown script 'flux-xl'"),
        (LaunchSpec("flux", nnodes=2, node_rank=2), 0, "--node-rank 2 is not a node of --nnodes 2"),
        (LaunchSpec("flux", nproc_per_node=0), 0, "--nproc-per-node must be at least 1"),
        (LaunchSpec("flux", device="tpu"), 0, "unknown device 'tpu'"),
        (LaunchSpec("flux", env=(("BAD NAME", "1"),)), 0, "bad environment assignment"),
        (LaunchSpec("flux", env=(("DANCEGRPO_DEVICE", "cpu"),)), 0, "DANCEGRPO_DEVICE is set by --device"),
        (LaunchSpec("flux", name="../escape"), 0, "not usable as a directory name"),
        (
            LaunchSpec("flux", device="npu", nproc_per_node=2, env=(("ASCEND_RT_VISIBLE_DEVICES", "0"),)),
            0,  # planned on a host without NPUs: the list is still checked against the process count
            "makes 1 NPU(s) visible but --nproc-per-node is 2",
        ),
        (
            LaunchSpec("flux", device="npu", nproc_per_node=2, env=(("ASCEND_RT_VISIBLE_DEVICES", "0,9"),)),
            8,
            "names device 9, but this host shows NPUs 0-7",
        ),
        (
            LaunchSpec("flux", device="npu", nproc_per_node=2, env=(("ASCEND_RT_VISIBLE_DEVICES", "0"),)),
            8,
            "makes 1 NPU(s) visible but --nproc-per-node is 2",
        ),
        (
            LaunchSpec("flux", device="npu", env=(("ASCEND_RT_VISIBLE_DEVICES", "x"),)),
            8,
            "is not a comma-separated list",
        ),
        (
            LaunchSpec("flux", device="npu", nproc_per_node=2, env=(("ASCEND_RT_VISIBLE_DEVICES", "1,1"),)),
            8,
            "names device 1 twice: torch_npu then sees no NPU at all (device_count() is 0); list each NPU once, "
            "in ascending order: ASCEND_RT_VISIBLE_DEVICES=1",
        ),
        (
            LaunchSpec("flux", device="npu", nproc_per_node=2, env=(("ASCEND_RT_VISIBLE_DEVICES", "3,2"),)),
            0,  # torch_npu's rule, checked on a login node too
            "ASCEND_RT_VISIBLE_DEVICES='3,2' is not in ascending order: torch_npu then sees no NPU at all "
            "(device_count() is 0); list each NPU once, in ascending order: ASCEND_RT_VISIBLE_DEVICES=2,3",
        ),
        (LaunchSpec("flux", args=("positional",)), 0, "is not a --flag"),
        (
            LaunchSpec("flux", args=("--pretrained_model_name_or_path", "/nowhere/flux")),
            0,
            "FLUX.1-dev weights directory /nowhere/flux does not exist",
        ),
        (LaunchSpec("flux", args=("--hps_ckpt", "/nowhere/hps.pt")), 0, "/nowhere/hps.pt does not exist"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(project, tmp_path, spec, dev_n, message):
    with pytest.raises(DancegrpoError) as e:
        plan_for(project, spec, tmp_path, dev=fake_dev(tmp_path, dev_n))
    assert message in e.value.one_line()
    assert e.value.hint  # every refusal says what to do


# ------------------------------------------------------------------ NPU jobs prepared on a host without NPUs


NPU_DEFAULT_NAMES = [d.name for d in ascend.NPU_ENV_DEFAULTS]


def test_npu_plan_on_a_host_without_npus_is_made_in_full(project, tmp_path):
    from dancegrpo_npu.run.environment import no_npu_here

    spec = LaunchSpec("flux", nproc_per_node=8, device="npu", env=(("ASCEND_RT_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15"),))
    plan = plan_for(project, spec, tmp_path, dev=fake_dev(tmp_path, 0))
    got = {n: (v, why) for n, v, why in plan.env_set}
    assert plan.profile == "npu" and plan.npus_here == 0
    assert [n for n in got if n in NPU_DEFAULT_NAMES] == NPU_DEFAULT_NAMES  # every Ascend setting, in order
    assert got["HCCL_CONNECT_TIMEOUT"] == ("1200", "launch default: " + ascend.NPU_ENV_DEFAULTS[3].why)
    # not checked against this host (it has none), only against --nproc-per-node
    assert got["ASCEND_RT_VISIBLE_DEVICES"] == ("8,9,10,11,12,13,14,15", "--env")
    err = no_npu_here(plan)
    assert err is not None and "this host shows no NPU" in err.message and str(tmp_path / "dev") in err.message
    assert no_npu_here(plan_for(project, spec, tmp_path, dev=fake_dev(tmp_path, 16))) is None


def test_npu_dry_run_without_npus_prints_the_plan_and_says_it_could_not_start_here(project, tmp_path, capsys):
    spec = LaunchSpec("flux", nproc_per_node=8, device="npu", master_port=29500)
    record = launch(project, spec, dry_run=True, dev_dir=fake_dev(tmp_path, 0))
    out, err = capsys.readouterr()
    assert record.returncode == 1 and record.summary["status"] == "dry-run"
    assert record.summary["problems"] == [
        f"--device npu, but this host shows no NPU ({tmp_path / 'dev'}/davinci* missing): run on a 910B node "
        "(in a container, map the NPUs with --device /dev/davinciN), or use --device cpu|cuda"
    ]
    assert "# could not start here:\n#   - --device npu, but this host shows no NPU" in out
    assert err.startswith("dancegrpo-npu: dry run: the job could not start here; 1 problem(s)") and err.count("\n") == 1
    for d in ascend.NPU_ENV_DEFAULTS:  # the HCCL/CANN settings with where each comes from
        assert f"export {d.name}={d.value}  # launch default: {d.why}" in out
    assert "export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7  # launch default: one NPU per process" in out
    assert "export DANCEGRPO_DEVICE=npu  # --device" in out
    assert "-m torch.distributed.run" in out and "--nproc_per_node 8" in out and "--master_port 29500" in out
    assert not project.runs_dir.exists()


def test_npu_real_launch_without_npus_refuses_before_anything_starts(project, tmp_path, capsys):
    with pytest.raises(DancegrpoError) as e:
        launch(project, LaunchSpec("flux", device="npu"), dev_dir=fake_dev(tmp_path, 0))
    assert "--device npu, but this host shows no NPU" in e.value.one_line() and "--device cpu|cuda" in e.value.hint
    assert not project.runs_dir.exists()
    assert capsys.readouterr().out == ""


def test_cli_npu_dry_run_on_this_host(project, capsys):
    """The command line, on this machine's own /dev (no NPU here, as on a login node)."""
    if ascend.davinci_count() > 0:
        pytest.skip("this host has NPUs: the login-node case cannot be shown here")
    assert main(["-C", str(project.root), "launch", "flux", "--device", "npu", "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert "#   - --device npu, but this host shows no NPU (/dev/davinci* missing)" in out
    assert "dry run: the job could not start here" in err
    assert "export HCCL_CONNECT_TIMEOUT=1200" in out and "torch.distributed.run" in out
    rc = main(["-C", str(project.root), "launch", "flux", "--device", "npu"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: --device npu, but this host shows no NPU" in err and "Traceback" not in err
    assert not project.runs_dir.exists()


def test_missing_weights_directory_from_upstream_default(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "p", weights=False))
    with pytest.raises(DancegrpoError, match=r"data/flux does not exist"):
        launch(project, LaunchSpec("flux", device="cpu"))
    assert not project.runs_dir.exists()  # no run directory for a launch that did not start


def test_missing_tree_says_fetch_and_apply(tmp_path):
    root = make_project(tmp_path / "p")
    project = find_project(root, workdir=tmp_path / "nowhere")
    with pytest.raises(DancegrpoError) as e:
        launch(project, LaunchSpec("flux"))
    assert "dancegrpo-npu fetch && dancegrpo-npu apply" in e.value.one_line()


def test_unverified_tree_is_refused(tmp_path, monkeypatch):
    """The engine's verify saying no stops the launch, with the engine's reason."""
    from dancegrpo_npu.engine import treecheck

    project = find_project(make_project(tmp_path / "p"))
    # A tree that was never fetched by the engine: the real verify refuses it.
    with pytest.raises(DancegrpoError, match="not lock \\+ series \\+ overlay .*dancegrpo-npu fetch"):
        launch(project, LaunchSpec("flux"))

    def verify_tree(project):
        raise DancegrpoError("fastvideo/utils/load.py differs from the series", "run dancegrpo-npu apply")

    monkeypatch.setattr(treecheck, "verify_tree", verify_tree)
    with pytest.raises(DancegrpoError, match="not lock \\+ series \\+ overlay .*load.py differs"):
        launch(project, LaunchSpec("flux"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["launch", "flux-xl"], "unknown script 'flux-xl'"),
        (["launch"], "name the script"),
        (["launch", "flux", "--max_train_steps", "3"], "unknown option '--max_train_steps'"),
        (["launch", "flux", "--env", "NOEQUALS"], "bad environment assignment 'NOEQUALS'"),
        (["launch", "flux", "--nnodes", "2", "--node-rank", "5"], "--node-rank 5 is not a node of --nnodes 2"),
        (["launch", "flux", "--nproc-per-node", "two"], "invalid int value"),
    ],
)
def test_cli_bad_input_one_line_error(project, capsys, argv, message):
    rc = main(["-C", str(project.root), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not project.runs_dir.exists()


# ------------------------------------------------------------------ the command line


def test_cli_dry_run_prints_command_and_environment_and_creates_nothing(project, capsys):
    rc = main(
        [
            "launch",
            "-C",
            str(project.root),
            "flux",
            "--dry-run",
            "--device",
            "cpu",
            "--master-port",
            "29999",
            "--env",
            "FOO=bar baz",
            "--",
            "--max_train_steps",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "export DANCEGRPO_DEVICE=cpu" in out and "export FOO='bar baz'  # --env" in out
    assert "--master_port 29999" in out and "--max_train_steps 2" in out
    assert f"--output_dir {project.runs_dir}" in out
    assert not project.runs_dir.exists()


def test_cli_options_before_or_after_the_script(project, capsys):
    for argv in (
        ["launch", "--nproc-per-node", "3", "flux", "--dry-run", "--", "--seed", "1"],
        ["launch", "flux", "--nproc-per-node", "3", "--dry-run", "--", "--seed", "1"],
    ):
        assert main(["-C", str(project.root), *argv]) == 0
        out = capsys.readouterr().out
        assert "--nproc_per_node 3" in out and "--seed 1" in out and "--seed 42" not in out


def test_cli_starts_without_importing_torch():
    code = "import sys; from dancegrpo_npu import cli; from dancegrpo_npu.run import launch, runner; from dancegrpo_npu.rundirs import listing, plot; from dancegrpo_npu.doctor import report; cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ real launches under torchrun


def test_real_launch_one_process_keeps_the_record(project, tmp_path):
    record = launch(
        project,
        LaunchSpec(
            "flux",
            device="cpu",
            name="one",
            args=("--max_train_steps", "3"),
            env=(("SYNTHETIC_EXTRA", "x"), ("WANDB_API_KEY", "s3cret")),
        ),
    )
    run = record.run_dir
    assert record.returncode == 0
    assert run.parent == project.runs_dir and run.name.endswith("-one")
    for rel in (
        "launch.json",
        "command.sh",
        "environment.json",
        "summary.json",
        "logs/console.log",
        "reward.txt",
        "metrics.jsonl",
        "images/flux_0_0.png",
        "outputs/checkpoint.txt",
    ):
        assert (run / rel).is_file(), rel
    summary = json.loads((run / "summary.json").read_text())
    assert summary == record.summary
    assert summary["status"] == "succeeded" and summary["returncode"] == 0 and summary["steps"] == 3
    assert summary["reward"]["first"] == pytest.approx(0.21) and summary["reward"]["last"] == pytest.approx(0.23)
    assert summary["loss"]["last"] == pytest.approx(1 / 3) and summary["images"] == 1
    assert summary["device_kind"] == "cpu" and summary["wall_time_s"] > 0
    assert any(p.endswith("0/stdout.log") for p in summary["rank_logs"])
    seen = json.loads((run / "seen-rank0.json").read_text())
    assert seen["cwd"] == str(run)
    assert seen["env"]["DANCEGRPO_DEVICE"] == "cpu" and seen["env"]["WANDB_MODE"] == "offline"
    assert seen["env"]["SYNTHETIC_EXTRA"] == "x"
    assert seen["env"]["PYTHONPATH"].split(":")[0] == str(project.workdir)
    env = json.loads((run / "environment.json").read_text())
    assert env["packages"]["torch"] and env["devices"]["kind"] == "cpu"
    assert env["upstream"]["locked_commit"] == "15cc71d53cc2e6e18a68ee607d5fb6ba9a99e344"
    assert len(env["upstream"]["series_sha256"]) == 64
    assert env["matmul_precision"] == {"reported": True, "device": "cpu", "allow_tf32": True,
                                       "source": "matmul_precision.json, written by the trainer's rank 0 at start"}
    launched = json.loads((run / "launch.json").read_text())
    assert launched["command"] == list(record.command) and launched["user_args"] == ["--max_train_steps", "3"]
    assert launched["recipe"]["name"] == "8gpus" and launched["recipe"]["world_size"] == 8
    assert launched["recipe"]["scaling"].startswith("world size 1 is not recipe 8gpus's (8): scaled it")
    assert "--max_train_steps 3 (script: 300; given after --)" in launched["recipe"]["differences"]
    assert launched["master_addr"] == "127.0.0.1"
    assert "synthetic trainer rank 0/1 started" in (run / "logs" / "console.log").read_text()
    for rel in ("launch.json", "command.sh", "environment.json", "summary.json"):
        assert "s3cret" not in (run / rel).read_text(), rel  # secrets passed with --env are not recorded


def test_real_launch_two_processes_from_the_cli(project, capsys):
    rc = main(
        [
            "-C",
            str(project.root),
            "launch",
            "flux",
            "--nproc-per-node",
            "2",
            "--device",
            "cpu",
            "--strict",
            "--env",
            "SYNTHETIC_ALLREDUCE=1",
            "--",
            "--max_train_steps",
            "2",
        ]
    )
    assert rc == 0
    (run,) = project.runs_dir.iterdir()
    seen = [json.loads((run / f"seen-rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["allreduce"] for s in seen] == [3.0, 3.0]  # a real gloo all_reduce over torchrun's rendezvous
    assert {s["env"]["LOCAL_RANK"] for s in seen} == {"0", "1"} and all(
        s["env"]["DANCEGRPO_NPU_STRICT"] == "1" for s in seen
    )
    assert sorted(p.name for p in (run / "images").iterdir()) == ["flux_0_0.png", "flux_1_0.png"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert len([p for p in summary["rank_logs"] if p.endswith("stderr.log")]) == 2


def test_failed_run_records_the_failure(project):
    record = launch(project, LaunchSpec("flux", nproc_per_node=2, device="cpu", args=("--fail_rank", "1")))
    assert record.returncode != 0
    summary = json.loads((record.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["returncode"] == record.returncode
    assert summary["failure"]["log"].endswith("1/stderr.log")
    assert any("synthetic failure on purpose" in line for line in summary["failure"]["tail"])
    assert summary["failure"]["error"] == "RuntimeError: synthetic failure on purpose"


def test_matmul_precision_report_missing_or_broken_says_why(tmp_path):
    assert trainer_matmul_precision(tmp_path) == {
        "reported": False,
        "why": "the trainer wrote no matmul_precision.json (it stopped before main(), or its tree predates the allow-tf32-hf32 patch)"}
    (tmp_path / "matmul_precision.json").write_text("{not json")
    got = trainer_matmul_precision(tmp_path)
    assert got["reported"] is False and got["why"].startswith("matmul_precision.json is unreadable: ")


def test_two_launches_in_the_same_second_get_two_directories(tmp_path):
    a = directory.create_run_dir(tmp_path, "flux", now=1_700_000_000)
    b = directory.create_run_dir(tmp_path, "flux", now=1_700_000_000)
    assert a != b and a.is_dir() and b.is_dir() and b.name == a.name + "-2"


@pytest.mark.parametrize(
    "name, hidden",
    [("WANDB_API_KEY", True), ("HF_TOKEN", True), ("AWS_SECRET_ACCESS_KEY", True), ("MY_PASSWORD", True),
     ("GITHUB_ACCESSTOKEN", True), ("TOKENIZERS_PARALLELISM", False), ("KEYBOARD_LAYOUT", False),
     ("HCCL_CONNECT_TIMEOUT", False)],
)
def test_only_secret_looking_variables_are_redacted(name, hidden):
    from dancegrpo_npu.run.environment import recorded_value

    assert (recorded_value(name, "v") == "<redacted>") is hidden


def test_fingerprint_git_head_reads_head_or_says_none(tmp_path):
    from dancegrpo_npu.run.fingerprint import git_head

    ident = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    subprocess.run(["git", "-C", str(tmp_path / "repo"), *ident, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_head(tmp_path / "repo") == head
    assert git_head(tmp_path / "missing") is None
    (tmp_path / "plain").mkdir()
    assert git_head(tmp_path / "plain") is None
