"""The tiny models, each read back through the code that reads the real one, on CPU.

The FLUX pipeline through ``FluxPipeline.from_pretrained`` (offline), its parts
through the trainer's own ``from_pretrained`` calls, the HPS reward through the
exact hpsv2 call sequence of upstream's ``train_grpo_flux.py``.
"""

from __future__ import annotations

import pytest
from tiny_fixtures import built  # noqa: F401  (a fixture)

from dancegrpo_npu.smoke import fixtures as fx

torch = pytest.importorskip("torch")


# ---- the FLUX pipeline ------------------------------------------------------------------------


def test_pipeline_loads_offline_and_encodes_like_preprocessing(built):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(built.model_dir), torch_dtype=torch.bfloat16)
    assert pipe.vae_scale_factor == 8 and pipe.tokenizer_max_length == 77
    with torch.inference_mode():
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(prompt=["a cat"], prompt_2=["a cat"])
    assert prompt_embeds.shape == (1, 512, pipe.transformer.config.joint_attention_dim)
    assert pooled.shape == (1, pipe.transformer.config.pooled_projection_dim)
    assert text_ids.shape == (512, 3) and text_ids[0].shape == (3,)
    assert prompt_embeds.dtype == pooled.dtype == torch.bfloat16
    assert torch.isfinite(prompt_embeds.float()).all() and torch.isfinite(pooled.float()).all()
    n = sum(p.numel() for p in pipe.transformer.parameters())
    assert 50_000 < n < 120_000, n


def test_clip_tokenizer_matches_hpsv2s_tokenizer(built):
    from transformers import CLIPTokenizer

    fx.ensure_hpsv2_vocab()
    from hpsv2.src.open_clip import tokenize

    hf = CLIPTokenizer.from_pretrained(str(built.model_dir), subfolder="tokenizer")
    assert len(hf) == 49408
    for prompt in fx.PROMPTS + ("Ünïcode, punctuation!? and CAPS",):
        ours = hf(prompt, padding="max_length", max_length=77, truncation=True).input_ids
        theirs = tokenize([prompt])[0].tolist()
        assert ours[: ours.index(49407) + 1] == theirs[: theirs.index(49407) + 1], prompt


def test_t5_tokenizer_pads_to_512_with_t5_special_ids(built):
    from transformers import T5Tokenizer, T5TokenizerFast

    tok = T5TokenizerFast.from_pretrained(str(built.model_dir), subfolder="tokenizer_2")
    slow = T5Tokenizer.from_pretrained(str(built.model_dir), subfolder="tokenizer_2")  # the saved spiece.model
    pieces = slow.sp_model.get_piece_size()
    assert 100 < pieces <= 256 and len(tok) == len(slow) == pieces + 100  # + T5's 100 sentinels
    for prompt in fx.PROMPTS + ("an unseen word: zyxwvut, 42!",):
        assert tok(prompt).input_ids == slow(prompt).input_ids, prompt
    ids = tok("a cat on the moon", padding="max_length", max_length=512, truncation=True).input_ids
    assert len(ids) == 512 and tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert ids.count(tok.unk_token_id) == 0 and ids[ids.index(1) + 1 :] == [0] * (511 - ids.index(1))


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_transformer_forward_on_cpu(built, autocast):
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel.from_pretrained(str(built.model_dir), subfolder="transformer", torch_dtype=torch.float32)
    d = model.config.joint_attention_dim
    g = torch.Generator().manual_seed(0)
    kwargs = dict(
        hidden_states=torch.randn(1, 16, 64, generator=g),
        encoder_hidden_states=torch.randn(1, 512, d, generator=g),
        pooled_projections=torch.randn(1, model.config.pooled_projection_dim, generator=g),
        timestep=torch.tensor([0.5]),
        guidance=torch.tensor([3.5]),
        txt_ids=torch.zeros(512, 3),
        img_ids=torch.zeros(16, 3),
        return_dict=False,
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**kwargs)[0]
    assert out.shape == (1, 16, 64)
    assert out.dtype == (torch.bfloat16 if autocast else torch.float32)
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vae_decodes_8x8_latents_to_64x64_images(built, dtype):
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(str(built.model_dir), subfolder="vae", torch_dtype=dtype)
    assert (vae.config.scaling_factor, vae.config.shift_factor, vae.config.latent_channels) == (0.3611, 0.1159, 16)
    vae.enable_tiling()  # as the trainer does
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.inference_mode():
        image = vae.decode(latents / 0.3611 + 0.1159, return_dict=False)[0]
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image.float()).all()


# ---- the HPSv2-shaped reward -----------------------------------------------------------------


def test_hps_reward_loads_through_upstreams_code_path(built):
    """As train_grpo_flux.py main() does, with the port's --hps_model CONFIG.json registration."""
    from PIL import Image

    fx.ensure_hpsv2_vocab()
    from hpsv2.src.open_clip import create_model_and_transforms, get_tokenizer
    from hpsv2.src.open_clip.factory import add_model_config

    add_model_config(built.hps_model_config)
    name = built.hps_model_config.stem
    model, preprocess_train, preprocess_val = create_model_and_transforms(
        name, str(built.hps_open_clip_ckpt), precision="amp", device="cpu", jit=False,
        force_quick_gelu=False, force_custom_text=False, force_patch_dropout=False,
        force_image_size=None, pretrained_image=False, image_mean=None, image_std=None,
        light_augmentation=True, aug_cfg={}, output_dict=True,
        with_score_predictor=False, with_region_predictor=False,
    )  # fmt: skip
    open_clip_weights = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint = torch.load(built.hps_ckpt, map_location="cpu")
    assert set(checkpoint) == {"state_dict"}
    model.load_state_dict(checkpoint["state_dict"])
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, open_clip_weights[k])]
    assert changed, "the HPS checkpoint does not differ from the open_clip weights"
    reward_model = model.to("cpu").eval()
    tokenizer = get_tokenizer(name)
    assert reward_model.token_embedding.num_embeddings == 49408
    assert next(reward_model.parameters()).dtype == torch.float32  # 'amp' keeps float32 weights

    pixels = (torch.arange(64 * 64 * 3) % 251).to(torch.uint8).reshape(64, 64, 3).numpy()
    image = preprocess_val(Image.fromarray(pixels)).unsqueeze(0)
    text = tokenizer([fx.PROMPTS[0]])
    assert text.shape == (1, 77) and text.max() == 49407
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outputs = reward_model(image, text)
            score = torch.diagonal(outputs["image_features"] @ outputs["text_features"].T)
        assert score.shape == (1,) and torch.isfinite(score.float()).all() and abs(score.item()) <= 1.01
