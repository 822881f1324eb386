"""overlay/dancegrpo_port/rollout.py on its own (no upstream, no training): the argument
checks, the batch helpers, the chunked VAE decode and the batched reward inputs; the seam's
refusals of bad rollout and profile arguments.  The trainers themselves are run by
tests/patches/test_rollout_batching.py (slow).
"""

from __future__ import annotations

import argparse

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")

from dancegrpo_port import hooks, rollout  # noqa: E402  (overlay/ is on sys.path)


def make_args(**kw) -> argparse.Namespace:
    base = dict(sample_batch_size=1, vae_decode_chunk=None, num_generations=4, use_group=True, train_batch_size=1,
                gradient_accumulation_steps=4, seed=None)
    base.update(kw)
    return argparse.Namespace(**base)


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("n", [1, 2, 4])
def test_divisors_of_the_group_are_accepted(n):
    assert rollout.argument_problem(make_args(sample_batch_size=n)) is None
    assert rollout.decode_chunk(make_args(sample_batch_size=n)) == n
    assert rollout.decode_chunk(make_args(sample_batch_size=n, vae_decode_chunk=1)) == 1


@pytest.mark.parametrize("kw, expected", [
    (dict(sample_batch_size=0), "--sample_batch_size 0 must be at least 1"),
    (dict(sample_batch_size=-2), "--sample_batch_size -2 must be at least 1"),
    (dict(sample_batch_size=3), "--sample_batch_size 3 does not divide --num_generations 4: pick one of 1, 2, 4"),
    (dict(sample_batch_size=8), "--sample_batch_size 8 does not divide --num_generations 4"),
    (dict(sample_batch_size=2, use_group=False, train_batch_size=3),
     "--sample_batch_size 2 does not divide --train_batch_size (no --use_group) 3: pick one of 1, 3"),
    (dict(vae_decode_chunk=0), "--vae_decode_chunk 0 must be at least 1"),
])  # fmt: skip
def test_bad_arguments_are_named(kw, expected):
    problem = rollout.argument_problem(make_args(**kw))
    assert problem is not None and problem.startswith(expected) and "\n" not in problem


def test_check_args_refuses_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train_grpo_flux.py"])
    with pytest.raises(SystemExit) as exit_:
        hooks.check_arguments(make_args(sample_batch_size=3))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train_grpo_flux.py: error: --sample_batch_size 3 ")
    hooks.check_arguments(make_args(sample_batch_size=2))  # a good one passes silently
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- batch helpers


def test_txt_ids_one_set_for_the_batch():
    ids = torch.zeros(1, 3)
    assert torch.equal(rollout.txt_ids(ids, 5), ids.repeat(5, 1))  # upstream's op at N = 1
    batch = torch.arange(12.0).reshape(4, 3)
    # upstream's repeat would make (20, 3); diffusers' Flux takes one set for the batch
    assert torch.equal(rollout.txt_ids(batch, 5), batch[:1].repeat(5, 1))


def test_shared_initial_latents_serve_every_sample():
    shared = torch.randn(1, 16, 4, 4)
    assert rollout.per_sample(shared, 1) is shared
    expanded = rollout.per_sample(shared, 3)
    assert expanded.shape == (3, 16, 4, 4) and all(torch.equal(x, shared[0]) for x in expanded)
    own = torch.randn(3, 16, 4, 4)
    assert rollout.per_sample(own, 3) is own


def test_one_image_id_entry_per_sample():
    ids = torch.zeros(16, 3)
    entries = rollout.image_ids_per_sample(ids, 4)
    assert len(entries) == 4 and torch.stack(entries).shape == (4, 16, 3)


# ---------------------------------------------------------------- the decode


class Attention(torch.nn.Module):
    """Named like diffusers' Attention; returns (B, C, H, W) with channels-last strides, as
    diffusers' attention processor does for a VAE mid-block."""

    def forward(self, x):
        b, c, h, w = x.shape
        tokens = x.reshape(b, c, h * w).transpose(1, 2).contiguous()  # (B, HW, C), new memory
        return tokens.transpose(1, 2).reshape(b, c, h, w)


class FakeVAE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Sequential(Attention())
        self.calls, self.contiguous = [], []

    def decode(self, latents, return_dict=True):
        self.calls.append(latents.shape[0])
        out = self.decoder(latents)
        self.contiguous.append(out.is_contiguous())
        return (out,)


def postprocess(images):
    return [f"image{tuple(im.shape)}" for im in images]


@pytest.mark.parametrize("n, chunk, calls", [(1, 1, [1]), (4, 4, [4]), (4, 2, [2, 2]), (4, 1, [1, 1, 1, 1]), (2, 8, [2])])
def test_decode_in_chunks(n, chunk, calls):
    vae = FakeVAE()
    images = rollout.decode(vae, torch.randn(n, 4, 2, 2), chunk, postprocess)
    assert vae.calls == calls and len(images) == n
    # the attention outputs are made contiguous only for chunks of more than one image
    assert vae.contiguous == [size > 1 for size in calls]
    assert not any(m._forward_hooks for m in vae.decoder.modules())  # the hooks are gone


def test_batched_decode_of_a_real_vae_is_one_at_a_time_decode():
    """The reason for contiguous_attention: a diffusers AutoencoderKL (the smoke fixture's shape)
    in bfloat16 decodes a batch exactly as it decodes each image alone."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 8, 16, 16), layers_per_block=1,
        norm_num_groups=4, down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        use_quant_conv=False, use_post_quant_conv=False).to(torch.bfloat16)  # fmt: skip
    latents = torch.randn(3, 16, 8, 8, dtype=torch.bfloat16)
    keep = lambda x: [x]  # noqa: E731  (postprocess that keeps the tensor)
    with torch.inference_mode():
        alone = torch.cat([rollout.decode(vae, latents[i : i + 1], 1, keep)[0] for i in range(3)])
        batch = torch.cat(rollout.decode(vae, latents, 3, keep))
    assert torch.equal(batch, alone)


class JointAttentionOutput(torch.nn.Module):
    """What a joint attention does after its attention (Qwen-Image's, HunyuanVideo's double
    blocks): the output split into the video and the text tokens, each slice projected."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.to_out = torch.nn.ModuleList([torch.nn.Linear(dim, dim), torch.nn.Dropout(0.0)])
        self.to_add_out = torch.nn.Linear(dim, dim)

    def forward(self, joint: torch.Tensor, text: int):
        return self.to_out[0](joint[:, :-text]), self.to_add_out(joint[:, -text:])


@pytest.mark.parametrize("contiguous", [True, False])
def test_a_batch_of_projections_is_each_sample_alone_with_contiguous_inputs(contiguous):
    """rollout.contiguous_projections: with it a batch projects as its samples do alone; without
    it (the reason for it) a bfloat16 Linear on the batch's strided slice rounds otherwise."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(JointAttentionOutput()).to(torch.bfloat16)
    joint = torch.randn(4, 256 + 20, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        alone = [torch.cat(parts) for parts in zip(*(block[0](joint[i : i + 1], 20) for i in range(4)))]
        with rollout.contiguous_projections(block, contiguous):
            batch = block[0](joint, 20)
    assert all(torch.equal(a, b) for a, b in zip(alone, batch)) == contiguous
    assert not block[0].to_out[0]._forward_pre_hooks  # the hooks go when the rollout ends


# ---------------------------------------------------------------- rewards


def test_hps_inputs_batch_the_images_and_their_captions():
    seen = []

    def tokenizer(texts):
        seen.append(list(texts))
        return torch.arange(len(texts))

    images = [torch.full((3, 2, 2), float(i)) for i in range(3)]
    image, text = rollout.hps_inputs(images, ["a", "b", "c"], lambda im: im * 2, tokenizer, "cpu")
    assert image.shape == (3, 3, 2, 2) and torch.equal(image[2], images[2] * 2)
    assert seen == [["a", "b", "c"]] and text.tolist() == [0, 1, 2]
    one, _ = rollout.hps_inputs(images[:1], ["a"], lambda im: im * 2, tokenizer, "cpu")
    assert torch.equal(one, (images[0] * 2).unsqueeze(0))  # upstream's input at N = 1


class FakeInputs(dict):
    def to(self, device):
        return self


class FakePick:
    """PickScore-shaped: a caption's embedding is one-hot on its letter, an image's is one-hot
    on the letter it shows, so an image scores 1 against its own caption and 0 otherwise."""

    def __init__(self):
        self.text_calls = 0

    def processor(self, text=None, images=None, **kw):
        return FakeInputs(x=text if text is not None else images)

    def get_text_features(self, x):
        self.text_calls += 1
        return torch.nn.functional.one_hot(torch.tensor([ord(t) - 97 for t in x]), 4).float()

    def get_image_features(self, x):
        return torch.nn.functional.one_hot(torch.tensor([ord(t) - 97 for t in x]), 4).float()


def test_pickscore_scores_each_image_against_its_own_caption_with_the_text_encoded_once(monkeypatch):
    monkeypatch.setattr(rollout, "PICKSCORE_TEXT", rollout.PickScoreText())
    pick = FakePick()
    captions = ["a", "a", "b", "b"]
    scores = []
    for batch_idx, images in ((torch.tensor([0, 1]), ["a", "b"]), (torch.tensor([2, 3]), ["b", "c"])):
        scores += rollout.pickscore(pick.processor, pick, captions, images, batch_idx, "cpu").tolist()
    assert scores == [1.0, 0.0, 1.0, 0.0] and pick.text_calls == 1
    # at N = 1, upstream's (text_embs @ image_embs.T)[0] with the step's captions
    embs = rollout.PICKSCORE_TEXT(pick.processor, pick, captions, "cpu")
    upstream = (embs @ pick.get_image_features(["a"]).T)[0]
    assert rollout.pickscore(pick.processor, pick, captions, ["a"], torch.tensor([1]), "cpu").tolist() == upstream.tolist()
    assert pick.text_calls == 1  # the same captions: still encoded once
    rollout.pickscore(pick.processor, pick, ["c", "d"], ["c"], torch.tensor([0]), "cpu")
    assert pick.text_calls == 2  # the next step's captions are encoded anew


@pytest.mark.parametrize("text", [None, "", "3", "2-4", "1,5"])
def test_good_profile_steps_pass(text, capsys):
    hooks.check_arguments(make_args(profile_steps=text))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("text", ["x", "0", "4-2", "1,,2"])
def test_bad_profile_steps_are_refused_with_one_line(text, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train_grpo_flux_lora.py"])
    with pytest.raises(SystemExit) as exit_:
        hooks.check_arguments(make_args(profile_steps=text))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"train_grpo_flux_lora.py: error: --profile_steps {text!r}: ")
