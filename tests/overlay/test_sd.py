"""overlay/dancegrpo_port/sd.py: the port's flags in upstream's absl / ml_collections SD trainer."""

from __future__ import annotations

import argparse
import importlib.util

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

from dancegrpo_port import sd  # noqa: E402

pytest.importorskip("ml_collections")


@pytest.fixture
def config(patched_tree):
    """Upstream's dgx.py:hpsv2 configuration, loaded from the patched tree as absl loads it."""
    path = patched_tree.project.workdir / "fastvideo" / "config_sd" / "dgx.py"
    spec = importlib.util.spec_from_file_location("dgx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config("hpsv2")


def parse(*argv):
    parser = argparse.ArgumentParser()
    sd.add_arguments(parser)
    args, rest = parser.parse_known_args(list(argv))
    return args, rest


@pytest.mark.upstream
def test_a_flag_given_sets_its_key_and_one_not_given_takes_it(config):
    args, rest = parse("--seed", "7", "--config", "x.py:hpsv2", "--config.train.learning_rate=1e-4")
    assert rest == ["--config", "x.py:hpsv2", "--config.train.learning_rate=1e-4"]  # absl's
    sd.settle(args, config)
    assert config.seed == 7 and args.seed == 7
    assert args.num_generations == config.num_generations == 16 and args.sampling_steps == config.sample.num_steps == 50
    # upstream's recipe: 4 prompts x 16 generations a rank, 4 a batch x 8 accumulated: 2 updates an epoch
    assert args.updates_per_epoch == 2 and args.train_batch_size == 4 and args.gradient_accumulation_steps == 32
    assert sd.argument_problem(args, config) is None


@pytest.mark.upstream
@pytest.mark.parametrize("change, message", [
    (lambda a, c: setattr(c, "use_lora", True), "config.use_lora=True: upstream's LoRA path"),
    (lambda a, c: setattr(c, "reward_fn", "hpsv3"), "config.reward_fn='hpsv3' needs the hpsv3 package"),
    (lambda a, c: setattr(a, "checkpointing_steps", 3), "--checkpointing_steps 3 must be a positive multiple of the 2"),
    (lambda a, c: setattr(a, "max_train_steps", 1), "--max_train_steps 1 must be a positive multiple of the 2"),
    (lambda a, c: setattr(c.train, "gradient_accumulation_steps", 6), "an epoch's 64 samples a rank"),
    (lambda a, c: setattr(c.train, "batch_size", 8), "config.sample.batch_size 4 must be a multiple of"),
    (lambda a, c: setattr(a, "h", 500), "--h 500 --w 512: the SD VAE needs multiples of 8"),
    # the seam's SDE window flags reach every trainer's parser; this one says why it has none
    (lambda a, c: setattr(a, "sde_window_size", 2), "--sde_window_size 2: the SD trainer takes no SDE window: its "
                                                    "DDIM pipeline passes one eta to every step, its log-prob is NaN "
                                                    "at eta = 0"),
    (lambda a, c: setattr(a, "sde_window_shift_every", 1), "--sde_window_shift_every 1: the SD trainer takes no SDE"),
])
def test_what_cannot_run_is_refused_in_one_line(config, change, message):
    if "hpsv3" in message and importlib.util.find_spec("hpsv3"):
        pytest.skip("hpsv3 is installed here")
    args, _ = parse()
    change(args, config)
    sd.settle(args, config)
    problem = sd.argument_problem(args, config)
    assert problem and message in problem and "\n" not in problem


def test_a_resume_skips_the_epochs_trained_and_the_run_stops_at_its_last_step():
    loader = ["p0", "p1", "p2", "p3", "p4"]
    assert [e for e, _ in sd.epochs(loader, 0, 2, None, 300)] == [0, 1, 2, 3, 4]
    assert [e for e, _ in sd.epochs(loader, 4, 2, None, 300)] == [2, 3, 4]  # 4 updates: epochs 0 and 1 done
    assert [e for e, _ in sd.epochs(loader, 0, 2, 6, 300)] == [0, 1, 2]  # --max_train_steps 6
    assert [e for e, _ in sd.epochs(loader, 0, 1, None, 2)] == [0, 1, 2]  # upstream's rule: epochs 0..num_epochs


def test_a_step_is_an_update_and_the_next_begins_inside_the_epoch(monkeypatch):
    from dancegrpo_port import hooks

    calls = []
    monkeypatch.setattr(hooks, "step_begin", lambda step: calls.append(("begin", step)))
    monkeypatch.setattr(hooks, "step_end", lambda step, **f: calls.append(("end", step, sorted(f))))
    steps = sd.Steps(per_epoch=2, lr=1e-5)
    steps.begin(1)
    steps.end(1, loss=0.5, grad_norm=1.0)
    steps.end(2, loss=0.5, grad_norm=1.0)
    assert calls == [("begin", 1), ("end", 1, ["grad_norm", "loss", "lr", "step_time"]), ("begin", 2),
                     ("end", 2, ["grad_norm", "loss", "lr", "step_time"])]


def test_a_unet_checkpoint_is_written_whole_with_its_config(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    from dancegrpo_npu.trainers.sd.fixtures import UNET_CONFIG

    unet = diffusers.UNet2DConditionModel(cross_attention_dim=16, **UNET_CONFIG)
    target = tmp_path / "checkpoint_epoch_1"
    target.mkdir()
    (target / "stale").write_text("from a stopped save")
    sd.save_unet(unet, str(target))
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    assert not (tmp_path / "checkpoint_epoch_1.tmp").exists()
    loaded = diffusers.UNet2DConditionModel.from_pretrained(target)
    assert all(torch_equal(a, b) for a, b in zip(loaded.state_dict().values(), unet.state_dict().values()))


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


class FakeHps(__import__("torch").nn.Module):
    """HPSv2's interface: features of the image and of the text, their product the score."""

    def forward(self, image, text):
        return {"image_features": image.flatten(1)[:, :4], "text_features": text.float()[:, :4]}


def hps_inputs():
    import numpy as np
    from PIL import Image

    torch = __import__("torch")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)) for _ in range(3)]
    preprocess = lambda im: torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1)  # noqa: E731
    processor = lambda captions: torch.tensor([[len(c), 1, 2, 3] for c in captions])  # noqa: E731
    return images, ["a cat", "a dog on a hill", "a house"], preprocess, processor


def test_a_batch_scores_as_one_image_at_a_time_and_jpeg_is_upstreams_round_trip(tmp_path, monkeypatch):
    import argparse as ap

    torch = __import__("torch")
    monkeypatch.chdir(tmp_path)
    images, captions, preprocess, processor = hps_inputs()
    names = [f"image-0-{j}-rank-0.jpg" for j in range(3)]

    def score(**flags):
        args = ap.Namespace(**{"reward_from_jpeg": False, "reward_batch_size": 0, **flags})
        return sd.hps_rewards(args, images, captions, preprocess, processor, FakeHps(), "cpu", names)

    batch, single = score(), score(reward_batch_size=1)
    assert batch.shape == (3,) and torch.equal(batch, single)
    assert not (tmp_path / "images_same").exists()  # from memory: nothing written
    jpeg = score(reward_from_jpeg=True)
    assert sorted(p.name for p in (tmp_path / "images_same").iterdir()) == names
    assert not torch.equal(jpeg, batch)  # the lossy round trip moves the score
