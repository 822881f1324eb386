"""overlay/dancegrpo_port/reward.py: the HPSv2 reward's arguments, their check at start, its loading."""

from __future__ import annotations

import argparse

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

from dancegrpo_port import reward  # noqa: E402


def parser_with_reward() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train_grpo_x.py")
    parser.add_argument("--use_hpsv2", action="store_true", default=False)
    reward.add_arguments(parser)
    return parser


def test_the_arguments_default_to_upstreams_hard_coded_values():
    args = parser_with_reward().parse_args([])
    assert (args.hps_model, args.hps_open_clip_ckpt, args.hps_ckpt) == (
        "ViT-H-14", "./hps_ckpt/open_clip_pytorch_model.bin", "./hps_ckpt/HPS_v2.1_compressed.pt")


def test_without_use_hpsv2_nothing_is_checked(tmp_path):
    args = parser_with_reward().parse_args(["--hps_ckpt", str(tmp_path / "nope.pt")])
    assert reward.argument_problem(args) is None


def test_each_missing_file_is_named_with_its_flag(tmp_path):
    clip, ckpt, config = tmp_path / "clip.bin", tmp_path / "hps.pt", tmp_path / "tiny.json"
    base = ["--use_hpsv2", "--hps_open_clip_ckpt", str(clip), "--hps_ckpt", str(ckpt), "--hps_model", str(config)]
    parser = parser_with_reward()
    assert reward.argument_problem(parser.parse_args(base)) == f"HPSv2 file not found: {clip} (pass --hps_open_clip_ckpt PATH)"
    clip.write_bytes(b"")
    assert reward.argument_problem(parser.parse_args(base)) == f"HPSv2 file not found: {ckpt} (pass --hps_ckpt PATH)"
    ckpt.write_bytes(b"")
    assert reward.argument_problem(parser.parse_args(base)) == f"HPSv2 file not found: {config} (pass --hps_model PATH)"
    config.write_text("{}")
    assert reward.argument_problem(parser.parse_args(base)) is None
    # a model name (no .json) is open_clip's to know, not a file
    assert reward.argument_problem(parser.parse_args(base[:-2] + ["--hps_model", "ViT-H-14"])) is None


def test_check_arguments_is_a_usage_error_of_the_trainers_parser(tmp_path, capsys):
    parser = parser_with_reward()
    args = parser.parse_args(["--use_hpsv2", "--hps_open_clip_ckpt", str(tmp_path / "x.bin")])
    with pytest.raises(SystemExit) as stopped:
        reward.check_arguments(parser, args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"train_grpo_x.py: error: HPSv2 file not found: {tmp_path / 'x.bin'} (pass --hps_open_clip_ckpt PATH)"


def test_load_hps_is_upstreams_loading_with_the_files_given(tmp_path):
    """The open_clip model from --hps_model (a config JSON, registered and used by its name), the
    open_clip weights, then the HPSv2 checkpoint over them, in eval mode on the device, with the
    model's tokenizer: what upstream's block in main() makes of its hard-coded files."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("hpsv2")
    from dancegrpo_npu.smoke import fixtures as fx
    from dancegrpo_npu.smoke.tiny_models import write_hps_checkpoints

    fx.ensure_hpsv2_vocab()
    config, clip, ckpt = tmp_path / "tiny-hps-reward.json", tmp_path / "open_clip.bin", tmp_path / "hps.pt"
    write_hps_checkpoints(config, clip, ckpt)
    args = argparse.Namespace(hps_model=str(config), hps_open_clip_ckpt=str(clip), hps_ckpt=str(ckpt))
    model, preprocess_val, processor = reward.load_hps(args, torch.device("cpu"))
    expected = torch.load(ckpt, map_location="cpu")["state_dict"]
    got = model.state_dict()
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
    assert not model.training
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert processor(["a photo"]).shape == (1, 77)
    from PIL import Image

    assert preprocess_val(Image.new("RGB", (64, 64))).shape == (3, 32, 32)  # the config's image size
