"""Recipes (upstream's launch scripts in the tree, here synthetic ones in upstream's layout), the
dry run on a login node, and the network options: all checked before anything starts."""

from __future__ import annotations

import os
import subprocess

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.host import network
from dancegrpo_npu.run import recipes
from dancegrpo_npu.run.environment import shell_script
from dancegrpo_npu.run.launch import LaunchSpec, build_plan

ENV = {"PATH": os.environ["PATH"], "HOME": "/home/u"}


@pytest.fixture
def project(tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    return find_project(make_project(tmp_path / "proj"))


def plan_of(project, tmp_path, spec, **kw):
    return build_plan(project, spec, project.runs_dir / "RUN", environ=ENV, cwd=tmp_path, dev_dir=tmp_path, **kw)


def arg(plan, flag):
    args = list(plan.script_args)
    return args[args.index(flag) + 1]


# ------------------------------------------------------------------ which recipe, and scaling


@pytest.mark.parametrize("nnodes, nproc, name, tb, accum", [(1, 8, "8gpus", "2", "12"), (2, 8, "2nodes", "1", "4")])
def test_the_recipe_of_the_launchs_world_size_is_the_default(project, tmp_path, nnodes, nproc, name, tb, accum):
    spec = LaunchSpec("flux", nproc_per_node=nproc, nnodes=nnodes, master_addr="192.0.2.1" if nnodes > 1 else None)
    plan = plan_of(project, tmp_path, spec)
    assert plan.recipe.name == name and plan.recipe_scaling is None
    assert (arg(plan, "--train_batch_size"), arg(plan, "--gradient_accumulation_steps")) == (tb, accum)


def test_a_world_size_no_recipe_has_scales_the_nearest_and_says_how(project, tmp_path, capsys):
    plan = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=4))
    assert plan.recipe.name == "8gpus"
    # 16 prompts per step and 96 samples per optimizer step, as the 8-rank script
    assert (arg(plan, "--train_batch_size"), arg(plan, "--train_sp_batch_size")) == ("4", "4")
    assert arg(plan, "--gradient_accumulation_steps") == "24"
    assert plan.recipe_scaling == (
        "world size 4 is not recipe 8gpus's (8): scaled it (--train_batch_size 2 -> 4, --train_sp_batch_size 2 -> 4, "
        "--gradient_accumulation_steps 12 -> 24): 16 prompts per step, accumulation 24, effective batch 96 samples "
        "per optimizer step; the script has 16 prompts per step, accumulation 12, effective batch 96 samples per "
        "optimizer step"
    )
    assert main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"# recipe 8gpus: {project.workdir}/scripts/finetune/finetune_flux_grpo_8gpus.sh (8 ranks); world size 4" in out
    assert "#   --train_batch_size 4 (script: 2; scaled to world size 4)" in out


def test_a_named_recipe_at_another_world_size_is_scaled_too(project, tmp_path):
    plan = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8, recipe="2nodes"))
    assert plan.recipe.name == "2nodes" and "world size 8 is not recipe 2nodes's (16)" in plan.recipe_scaling
    # the 2-node script's 16 prompts per step, not 8: each rank takes 2
    assert arg(plan, "--train_batch_size") == "2" and arg(plan, "--gradient_accumulation_steps") == "8"
    assert arg(plan, "--max_grad_norm") == "1.0"  # the rest is that script's


def test_a_trainer_whose_batch_is_a_ranks_runs_the_recipe_as_it_is_at_any_world_size(project, tmp_path, monkeypatch):
    """HunyuanVideo's best-of-n and advantages are a rank's (its prompt's generations): scaling the
    prompts a rank takes would mix prompts in one best-of-n; the row says so (per_rank_batch)."""
    from dataclasses import replace

    from dancegrpo_npu import registry
    row = replace(registry.get("flux"), per_rank_batch="a rank's batch")
    monkeypatch.setitem(registry.REGISTRY, "flux", row)
    plan = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=4))
    assert plan.recipe.name == "8gpus"
    assert (arg(plan, "--train_batch_size"), arg(plan, "--gradient_accumulation_steps")) == ("2", "12")
    # the launch says how the recipe's global batch is kept: per rank, half of it a step
    assert plan.recipe_scaling.startswith("world size 4 is not recipe 8gpus's (8): its batch is kept per rank "
                                          "(a rank's batch), so a step takes 4/8 of the recipe's global batch: "
                                          "8 prompts per step, accumulation 12, effective batch 48 samples")
    assert "the script has 16 prompts per step" in recipes.recipe_line(plan)
    assert registry.get("hunyuan").per_rank_batch and registry.get("skyreels-i2v").per_rank_batch


def test_scaling_keeps_the_accumulation_a_divisor_of_the_samples_per_step():
    recipe = recipes.Recipe("r", None, "t.py", 1, 8, (("--train_batch_size", "2"), ("--num_generations", "12"),
                                                     ("--use_group", None), ("--gradient_accumulation_steps", "12")))
    for world in (1, 3, 5, 7, 12, 32):
        s = recipes.scale(recipe, world)
        assert s.after.samples_per_rank % s.after.accumulation == 0, world
    assert recipes.scale(recipe, 3).after.prompts_per_step == 15  # 16 does not split over 3 ranks


def test_the_dry_run_lists_every_value_that_differs_from_the_script(project, capsys):
    rc = main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--dry-run", "--", "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    tree = project.workdir
    notes = out[out.index("# values that differ"):out.index("set -euo")].splitlines()[1:]
    assert notes == [
        "#   --pretrained_model_name_or_path %s/data/flux (script: data/flux; resolved in the patched tree)" % tree,
        "#   --vae_model_path %s/data/flux (script: data/flux; resolved in the patched tree)" % tree,
        "#   --data_json_path %s/data/rl_embeddings/flux/videos2caption.json (script: "
        "data/rl_embeddings/videos2caption.json; this model's own dataset, resolved in the patched tree "
        "(`launch preprocess` writes it))" % tree,
        f"#   --hps_open_clip_ckpt {tree}/hps_ckpt/open_clip_pytorch_model.bin (not in the script; the port's flag for "
        "a path upstream hard-codes (in the working directory))",
        f"#   --hps_ckpt {tree}/hps_ckpt/HPS_v2.1_compressed.pt (not in the script; the port's flag for a path upstream "
        "hard-codes (in the working directory))",
        "#   --seed 1 (script: 7; given after --)",
        f"#   --output_dir {project.runs_dir}/" + out.split(f"--output_dir {project.runs_dir}/")[1].split(" ")[0]
        + " (script: data/outputs/grpo; the run's own outputs/)",
    ]


@pytest.mark.parametrize(
    "argv, rc, message",
    [
        (["flux", "--recipe", "9gpus"], 2, "flux has no recipe '9gpus'; choose one of: 8gpus (8 ranks), 2nodes (16 ranks)"),
        (["flux-lora", "--recipe", "8gpus"], 2, "flux-lora has no recipe '8gpus'; choose one of: 8gpus-lora (8 ranks)"),
        (["preprocess", "--recipe", "8gpus"], 2, "--recipe 8gpus: preprocess has no recipes"),
        (["flux", "--recipe", "8gpus", "--no-upstream-defaults"], 2, "--no-upstream-defaults uses none"),
    ],
)
def test_bad_recipe_is_one_line(project, capsys, argv, rc, message):
    assert main(["-C", str(project.root), "launch", *argv, "--dry-run"]) == rc
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_unparseable_script_is_one_line_naming_it(project, capsys):
    script = project.workdir / "scripts/finetune/finetune_flux_grpo_8gpus.sh"
    script.write_text('torchrun --nproc_per_node=8 fastvideo/train_grpo_flux.py --h "720\n')
    assert main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert f"error: upstream's launch script {script} cannot be read as a recipe: No closing quotation" in err
    assert err.count("\n") == 1 and "--no-upstream-defaults" in err
    script.write_text("echo no torchrun here\n")
    assert main(["-C", str(project.root), "launch", "flux", "--dry-run"]) == 1
    assert f"{script} cannot be read as a recipe: it has no torchrun command" in capsys.readouterr().err


def test_a_changed_script_changes_the_recipe(project, tmp_path):
    script = project.workdir / "scripts/finetune/finetune_flux_grpo_8gpus.sh"
    script.write_text(script.read_text().replace("--max_grad_norm 0.01", "--max_grad_norm 0.5"))
    assert arg(plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8)), "--max_grad_norm") == "0.5"


# ------------------------------------------------------------------ the dry run on a login node


def test_dry_run_checks_every_input_in_one_pass(tmp_path, monkeypatch, capsys):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "p", weights=False))
    tree = project.workdir
    (tree / "data" / "flux").mkdir(parents=True)  # an empty directory must not pass
    (tree / "data" / "rl_embeddings" / "flux").mkdir(parents=True)  # the embeddings directory without its JSON
    rc = main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--device", "cpu", "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 1
    listed = out[out.index("# could not start here:"):out.index("set -euo")].splitlines()[1:]
    assert listed == [
        f"#   - --pretrained_model_name_or_path: the FLUX.1-dev weights directory {tree}/data/flux is incomplete: "
        "transformer/ is missing, vae/ is missing",
        f"#   - --vae_model_path: the FLUX.1-dev VAE weights directory {tree}/data/flux is incomplete: vae/ is missing",
        f"#   - --data_json_path: the embeddings directory {tree}/data/rl_embeddings/flux has no videos2caption.json "
        "(RL-embeddings dataset: run `dancegrpo-npu launch preprocess` first)",
        f"#   - --hps_open_clip_ckpt: {tree}/hps_ckpt/open_clip_pytorch_model.bin does not exist (open_clip ViT-H-14 "
        "weights for the HPS reward)",
        f"#   - --hps_ckpt: {tree}/hps_ckpt/HPS_v2.1_compressed.pt does not exist (HPS_v2.1_compressed.pt reward weights)",
    ]
    assert err == ("dancegrpo-npu: dry run: the job could not start here; 5 problem(s), listed in the plan under "
                   "'# could not start here'\n")
    assert not project.runs_dir.exists()
    # a real launch refuses with all of them in one line
    rc = main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "transformer/ is missing" in err and "HPS_v2.1_compressed.pt does" in err


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda flux: (flux / "vae" / "config.json").unlink(), "vae/ has no config.json"),
        (lambda flux: (flux / "transformer" / "model.safetensors").unlink(), "transformer/ has no weight files"),
    ],
)
def test_weights_without_their_config_or_weight_files_are_incomplete(project, tmp_path, break_it, message):
    break_it(project.workdir / "data" / "flux")
    plan = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8), dry_run=True)
    assert any(message in p for p in plan.problems), plan.problems
    with pytest.raises(DancegrpoError, match=message):
        plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8))


def test_empty_embeddings_json_is_incomplete(project, tmp_path):
    (project.workdir / "data/rl_embeddings/flux/videos2caption.json").write_text("[]")
    plan = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8), dry_run=True)
    assert plan.problems == (
        f"--data_json_path: {project.workdir}/data/rl_embeddings/flux/videos2caption.json holds no embeddings (a JSON list "
        "of them is expected) (RL-embeddings dataset: run `dancegrpo-npu launch preprocess` first)",
    )


def test_a_complete_dry_run_exits_0(project, capsys):
    assert main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--device", "cpu",
                 "--dry-run"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert err == "" and "# could not start here" not in out


def test_the_plan_is_a_script_that_runs(project, tmp_path):
    """Shebang first; it creates the run directory, works in it, and stops at a failing command."""
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\npwd > "$0.cwd"\nls > "$0.ls"\n')
    fake.chmod(0o755)
    plan = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8), python=str(fake))
    text = shell_script(plan, dry_run=True)
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    script = tmp_path / "plan.sh"
    script.write_text(text)
    subprocess.run(["bash", str(script)], cwd=tmp_path, check=True, env=ENV)
    assert (tmp_path / "fake-python.cwd").read_text().strip() == str(project.runs_dir / "RUN")
    assert (tmp_path / "fake-python.ls").read_text().split() == ["images"]
    assert not (tmp_path / "images").exists()  # nothing is made where the script was started
    # a run directory that cannot be made stops the script before anything else
    bad = plan_of(project, tmp_path, LaunchSpec("flux", nproc_per_node=8), python=str(fake))
    text = shell_script(bad).replace(str(project.runs_dir / "RUN"), str(script / "RUN"))
    proc = subprocess.run(["bash", "-c", text], cwd=tmp_path, capture_output=True, text=True, env=ENV)
    assert proc.returncode != 0 and "Not a directory" in proc.stderr and not (tmp_path / "images").exists()


# ------------------------------------------------------------------ network options


HOST = network.Host(interfaces=("lo", "eth0"), addresses=frozenset({"127.0.0.1", "10.1.1.5"}))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nnodes", "2"], "--nnodes 2 needs --master-addr: without it each node would wait for itself"),
        (["--nnodes", "2", "--node-rank", "1"], "--nnodes 2 needs --master-addr"),
        (["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"],
         "--node-rank 1 with --master-addr 127.0.0.1: that is this host (127.0.0.1), but node 0 is another host"),
        (["--nnodes", "2", "--node-rank", "1", "--master-addr", "localhost"], "that is this host"),
        (["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.1.5"], "that is this host (10.1.1.5)"),
        (["--ifname", "eth9"], "--ifname eth9: this host has no such network interface (it has: lo, eth0)"),
        (["--master-port", "80"], "--master-port 80 is not a usable port; use a port in 1024..65535"),
        (["--master-port", "65536"], "--master-port 65536 is not a usable port"),
    ],
)  # fmt: skip
def test_network_options_that_would_hang_or_fail_are_refused(project, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(network, "this_host", lambda: HOST)
    assert main(["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", *argv, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("\n") == 1 and "; " in err  # with a hint


def test_network_options_that_fit_pass(project, monkeypatch, capsys):
    monkeypatch.setattr(network, "this_host", lambda: HOST)
    for argv in (["--node-rank", "1", "--master-addr", "10.1.1.9", "--ifname", "eth0"],
                 ["--node-rank", "0", "--master-addr", "10.1.1.5"]):
        assert main(["-C", str(project.root), "launch", "flux", "--nnodes", "2", "--nproc-per-node", "8",
                     "--device", "cpu", *argv, "--dry-run"]) == 0, capsys.readouterr().err  # fmt: skip
        capsys.readouterr()


def test_a_dry_run_of_several_nodes_on_a_login_node_names_what_it_could_not_check(project, monkeypatch, capsys):
    """The compute nodes' interface is not the login node's: the dry run plans the job (exit 1,
    as for a job that cannot start here) and names the interface as not checked; a real launch
    on that host, and a dry run of one node, still refuse it."""
    monkeypatch.setattr(network, "this_host", lambda: HOST)
    argv = ["-C", str(project.root), "launch", "flux", "--nnodes", "2", "--node-rank", "1", "--master-addr",
            "10.1.1.9", "--nproc-per-node", "8", "--device", "cpu", "--ifname", "ib0"]
    assert main([*argv, "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert "torch.distributed.run" in out and "--ifname ib0: this host has no such network interface" in out
    assert "not checked against the job's nodes" in out and err.count("\n") == 1
    assert main(argv) == 2 and "--ifname ib0: this host has no such network interface" in capsys.readouterr().err
    one_node = ["-C", str(project.root), "launch", "flux", "--nproc-per-node", "8", "--ifname", "ib0", "--dry-run"]
    assert main(one_node) == 2


def test_a_batch_of_one_prompt_is_said_in_the_singular():
    one = recipes.Batch(world_size=1, train_batch_size=1, accumulation=4, samples_per_rank=12)
    assert one.describe().startswith("1 prompt per step, accumulation 4")
    two = recipes.Batch(world_size=2, train_batch_size=1, accumulation=4, samples_per_rank=12)
    assert two.describe().startswith("2 prompts per step")
