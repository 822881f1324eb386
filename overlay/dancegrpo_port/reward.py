"""The HPSv2 reward of every trainer: its model and files as arguments, checked at start, loaded
onto the run's device.

Upstream's trainers hard-code the open_clip model ``'ViT-H-14'`` and its two checkpoints under
``./hps_ckpt/`` (relative to wherever the script starts), and load the HPSv2 checkpoint with
``map_location=f'cuda:{device}'``; a missing file surfaces deep inside open_clip or
``torch.load``.  Each trainer calls, in place of those lines:

    reward.add_arguments(parser)                  after upstream's --use_hpsv2
    reward.check_arguments(parser, args)          after parse_args
    reward_model, preprocess_val, processor = reward.load_hps(args, device)   upstream's block

The arguments keep upstream's values as defaults.  ``load_hps`` makes upstream's calls in
upstream's order (the same open_clip model, built with the same options, the same weights), so a
run draws what upstream's draws.  Self-contained: the standard library and torch; hpsv2 is
imported only when the reward is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

HPS_MODEL = "ViT-H-14"
HPS_OPEN_CLIP_CKPT = "./hps_ckpt/open_clip_pytorch_model.bin"
HPS_CKPT = "./hps_ckpt/HPS_v2.1_compressed.pt"


def add_arguments(parser) -> None:
    """--hps_model, --hps_open_clip_ckpt, --hps_ckpt, upstream's values as defaults."""
    parser.add_argument(
        "--hps_model",
        type=str,
        default=HPS_MODEL,
        help="HPSv2's open_clip model: a model name, or an open_clip model-config JSON file (registered, used by its file name)",
    )
    parser.add_argument(
        "--hps_open_clip_ckpt",
        type=str,
        default=HPS_OPEN_CLIP_CKPT,
        help="the open_clip weights HPSv2 starts from",
    )
    parser.add_argument(
        "--hps_ckpt",
        type=str,
        default=HPS_CKPT,
        help="the HPSv2 checkpoint ({'state_dict': ...})",
    )


def argument_problem(args) -> str | None:
    """With --use_hpsv2, the first HPSv2 file that does not exist (one line), or None."""
    if not getattr(args, "use_hpsv2", False):
        return None
    files = [("--hps_open_clip_ckpt", args.hps_open_clip_ckpt), ("--hps_ckpt", args.hps_ckpt)]
    if args.hps_model.endswith(".json"):
        files.append(("--hps_model", args.hps_model))
    for flag, path in files:
        if not os.path.isfile(path):
            return f"HPSv2 file not found: {path} (pass {flag} PATH)"
    return None


def check_arguments(parser, args) -> None:
    """A usage error through the trainer's own parser (its usage, then one error line, exit 2)."""
    problem = argument_problem(args)
    if problem:
        parser.error(problem)


def model_name(hps_model: str) -> str:
    """The open_clip model name: a model-config JSON is registered with open_clip and used by
    its file name; anything else is a name open_clip knows."""
    if hps_model.endswith(".json"):
        from hpsv2.src.open_clip import add_model_config

        add_model_config(hps_model)
        return Path(hps_model).stem
    return hps_model


def load_hps(args, device):
    """Upstream's HPSv2 loading, with the files from the arguments and the checkpoint mapped onto
    ``device``: (reward_model, preprocess_val, processor), the model in eval mode on ``device``."""
    import torch
    from hpsv2.src.open_clip import create_model_and_transforms, get_tokenizer
    from hpsv2.utils import hps_version_map, root_path  # noqa: F401  (upstream imports them)

    hps_model = model_name(args.hps_model)
    model, _preprocess_train, preprocess_val = create_model_and_transforms(
        hps_model,
        args.hps_open_clip_ckpt,
        precision='amp',
        device=device,
        jit=False,
        force_quick_gelu=False,
        force_custom_text=False,
        force_patch_dropout=False,
        force_image_size=None,
        pretrained_image=False,
        image_mean=None,
        image_std=None,
        light_augmentation=True,
        aug_cfg={},
        output_dict=True,
        with_score_predictor=False,
        with_region_predictor=False,
    )
    checkpoint = torch.load(args.hps_ckpt, map_location=device)
    model.load_state_dict(checkpoint['state_dict'])
    processor = get_tokenizer(hps_model)
    reward_model = model.to(device)
    reward_model.eval()
    return reward_model, preprocess_val, processor
