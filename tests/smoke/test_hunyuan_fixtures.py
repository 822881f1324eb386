"""build_hunyuan_fixtures: the tiny HunyuanVideo and SkyReels-I2V pipelines, their datasets, the
FLUX first-frame pipeline and the VideoAlign reward, read through upstream's own loaders.

One build per module (seconds on two cores), with the patched tree's text encoder.  Then one
fresh interpreter, with the patched tree on its path (``CHECKS``), loads every part as the
trainers do: ``load_transformer("hunyuan_hf")`` (the repo-local class; its state dict is the
diffusers class's), the VAE, ``load_text_encoder("hunyuan_hf")`` + ``encode_prompt``,
``LatentDataset``, ``FluxPipeline``, and runs the transformers' forward at the trainers' call
(5 frames of 64x64: latents [1, 16, 2, 8, 8], guidance 6018.0; SkyReels: 32 channels and the
empty prompt's embeddings for CFG) and the VAE's tiled decode.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from snippet import run_snippet

from dancegrpo_npu.trainers.hunyuan import fixtures as hy
from dancegrpo_npu.smoke.child_build import STAMP_NAME
from dancegrpo_npu.smoke.fixtures import PROMPTS
from dancegrpo_npu.smoke.tiny_models import CLIP_TEXT_CONFIG

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

torch = pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[2] / "src"
CHINESE = "一只猫坐在红色的椅子上"
FRAMES, SIZE = 5, 64  # the smoke's video: latents [16, (5 - 1) // 4 + 1, 64 // 8, 64 // 8]
LATENT = (1, 16, (FRAMES - 1) // 4 + 1, SIZE // 8, SIZE // 8)

CHECKS = r"""
import json, sys, traceback
from pathlib import Path

import torch
from diffusers import AutoencoderKLHunyuanVideo, FluxPipeline, HunyuanVideoTransformer3DModel

from dancegrpo_npu.trainers.hunyuan.fixtures import with_tokenizers_copied
from fastvideo.dataset.latent_rl_datasets import LatentDataset, latent_collate_function
from fastvideo.utils.load import load_text_encoder, load_transformer, load_vae

fx = json.loads(sys.argv[1])
model_dir, sky_dir = fx["model_dir"], fx["skyreels_model_dir"]
out = {}

def last_line(error):
    return (traceback.format_exception_only(type(error), error)[-1]).strip()

def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sorted(sa) == sorted(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)

# the transformers: upstream's load_transformer -> the repo-local class, the diffusers class's weights
for name, path in (("hunyuan", model_dir), ("skyreels", sky_dir)):
    local = load_transformer("hunyuan_hf", None, path, torch.float32)
    ref = HunyuanVideoTransformer3DModel.from_pretrained(path, subfolder="transformer")
    out[name + "_transformer"] = {"class": type(local).__module__ + "." + type(local).__name__,
                                  "dtype": str(next(local.parameters()).dtype), "same_state": same_state(local, ref),
                                  "in_channels": local.config.in_channels,
                                  "params": sum(p.numel() for p in local.parameters())}

# the VAE: upstream's load_vae, else diffusers' from_pretrained
try:
    vae = load_vae("hunyuan_hf", model_dir)[0]
    out["load_vae"] = "loaded"
except Exception as error:
    out["load_vae"] = last_line(error)
    vae = AutoencoderKLHunyuanVideo.from_pretrained(model_dir, subfolder="vae", torch_dtype=torch.float32)
vae.enable_tiling()
torch.manual_seed(0)
with torch.no_grad():
    video = vae.decode(torch.randn(*fx["latent"]), return_dict=False)[0]
    first = vae.encode(torch.rand(1, 3, 1, fx["size"], fx["size"]) * 2 - 1).latent_dist.sample()
out["vae"] = {"decoded": list(video.shape), "finite": bool(torch.isfinite(video).all()),
              "first_frame_latent": list(first.shape), "params": sum(p.numel() for p in vae.parameters())}

# the text encoders: upstream's wrapper reads its tokenizers from text_encoder*/ (its script copies them)
try:
    load_text_encoder("hunyuan_hf", model_dir, device="cpu")
    out["encoder_without_copy"] = "loaded"
except Exception as error:
    out["encoder_without_copy"] = last_line(error)
copied = with_tokenizers_copied(Path(model_dir), Path("copied"))
text_encoder = load_text_encoder("hunyuan_hf", str(copied), device="cpu")
dataset = LatentDataset(fx["data_json"], 2, 0.0)
embeds, masks, captions = latent_collate_function([dataset[i] for i in range(len(dataset))])
with torch.inference_mode():
    again = [text_encoder.encode_prompt(prompt=[c]) for c in captions]
llm = text_encoder.text_encoder
kept = []  # the LLaMA tokens the crop keeps, as text
for c in captions:
    tokens = llm.text2tokens([c], data_type="video")
    crop = llm.prompt_template_video["crop_start"]
    kept.append(llm.tokenizer.decode(tokens.input_ids[0, crop:][tokens.attention_mask[0, crop:].bool()]))
out["dataset"] = {"embeds": list(embeds.shape), "dtype": str(embeds.dtype), "masks": list(masks.shape),
                  "mask_dtype": str(masks.dtype), "captions": list(captions),
                  "kept": kept,
                  "mask_is_a_prefix": all(bool(m[: int(m.sum())].all()) for m in masks),
                  "reencoded_equal": all(torch.equal(e[0], embeds[i]) and torch.equal(m[0], masks[i])
                                         for i, (e, m) in enumerate(again)),
                  "llm_layers": len(text_encoder.text_encoder.model.layers),
                  "llm_dtype": str(text_encoder.text_encoder.dtype)}
sky = LatentDataset(fx["skyreels_data_json"], 2, 0.0)
sky_embeds, sky_masks, sky_captions = latent_collate_function([sky[i] for i in range(len(sky))])
empty_embed = torch.load(Path(fx["skyreels_empty_dir"]) / "prompt_embed" / "0.pt", weights_only=True)
empty_mask = torch.load(Path(fx["skyreels_empty_dir"]) / "prompt_attention_mask" / "0.pt", weights_only=True)
out["skyreels_dataset"] = {"captions": list(sky_captions), "embeds": list(sky_embeds.shape),
                           "equal_to_hunyuan": bool(torch.equal(sky_embeds, embeds) and torch.equal(sky_masks, masks)),
                           "empty": [list(empty_embed.shape), list(empty_mask.shape), int(empty_mask.sum())],
                           "empty_json": json.loads((Path(fx["skyreels_empty_dir"]) / "videos2caption.json").read_text())}

# the forwards, at the trainers' call under the device's bfloat16 autocast
def forward(model, hidden, enc, mask, guidance):
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        return model(hidden_states=hidden, encoder_hidden_states=enc, timestep=torch.full([hidden.shape[0]], 937, dtype=torch.long),
                     guidance=torch.tensor(guidance, dtype=torch.bfloat16), encoder_attention_mask=mask,
                     return_dict=False)[0]

torch.manual_seed(1)
z = torch.randn(*fx["latent"])
transformer = load_transformer("hunyuan_hf", None, model_dir, torch.float32).eval()
try:
    pred = forward(transformer, z, embeds[:1], masks[:1], [6018.0])
    padded = embeds[:1].clone()
    padded[:, 1 + int(masks[0].sum()):] = 7.0  # the embeddings the mask leaves out
    other = forward(transformer, z, embeds[1:2], masks[1:2], [6018.0])
    out["forward"] = {"shape": list(pred.shape), "dtype": str(pred.dtype), "finite": bool(torch.isfinite(pred).all()),
                      "padding_ignored": bool(torch.equal(forward(transformer, z, padded, masks[:1], [6018.0]), pred)),
                      "prompt_seen": not bool(torch.equal(other, pred))}
except Exception as error:
    out["forward"] = {"error": last_line(error)}

sky_transformer = load_transformer("hunyuan_hf", None, sky_dir, torch.float32).eval()
try:
    latents = torch.cat([z, torch.randn(*fx["latent"])], dim=1)  # the noise, the first frame's latents
    both = forward(sky_transformer, latents.repeat(2, 1, 1, 1, 1), torch.cat((sky_embeds[:1], empty_embed[None])),
                   torch.cat((sky_masks[:1], empty_mask[None])), [1000.0] * 2)
    cond, uncond = both.chunk(2)
    out["skyreels_forward"] = {"shape": list(both.shape), "finite": bool(torch.isfinite(both).all()),
                               "cfg_differs": not bool(torch.equal(cond, uncond))}
except Exception as error:
    out["skyreels_forward"] = {"error": last_line(error)}

# SkyReels' first frame: the FLUX pipeline as the trainer loads it, smaller and shorter
pipe = FluxPipeline.from_pretrained(fx["flux_dir"], torch_dtype=torch.bfloat16)
image = pipe(captions[0], height=fx["size"], width=fx["size"], guidance_scale=3.5, num_inference_steps=2,
             max_sequence_length=512, generator=torch.Generator().manual_seed(0)).images[0]
out["flux"] = list(image.size)
# the tiny VideoAlign scores videos the tiny VAE decodes from distinct latents distinctly (bfloat16, as the
# trainers load it): a group whose scores coincide teaches GRPO nothing
try:
    from fastvideo.models.videoalign.inference import VideoVLMRewardInference
    from dancegrpo_port import videoalign

    inferencer = VideoVLMRewardInference(fx["videoalign_ckpt"], device="cpu", dtype=torch.bfloat16,
                                         base_model=fx["videoalign_base"])
    torch.manual_seed(1)
    with torch.no_grad():
        clips = [(vae.decode(torch.randn(*fx["latent"]), return_dict=False)[0][0] / 2 + 0.5).clamp(0, 1)
                 .permute(1, 2, 3, 0).float() for _ in range(8)]
    scored = videoalign.score(inferencer, [videoalign.Frames(c, fps=8) for c in clips], [captions[0]] * 8,
                              list(range(8)))
    out["videoalign_vq"] = [s["VQ"] for s in scored]
except Exception as error:
    out["videoalign_vq"] = last_line(error)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def built(patched_tree, tmp_path_factory):
    work = tmp_path_factory.mktemp("hunyuan")
    prompts = work / "prompts.txt"
    prompts.write_text("".join(p + "\n" for p in (*PROMPTS[:3], CHINESE)))
    return hy.build_hunyuan_fixtures(work / "fixtures-hunyuan", prompts, sys.executable, patched_tree.tree)


@pytest.fixture(scope="module")
def checked(built, patched_tree, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hunyuan-checks")
    paths = {k: str(v) for k, v in vars(built).items()} | {"latent": list(LATENT), "size": SIZE}
    proc = run_snippet(CHECKS, tmp, [str(SRC), str(patched_tree.tree)], {"DANCEGRPO_DEVICE": "cpu"},
                       args=[json.dumps(paths)], timeout=600)
    line = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert line, proc.stdout + proc.stderr
    return json.loads(line[-1][len("RESULT "):])


def test_layout_is_the_diffusers_pipelines_and_upstreams_data_dirs(built):
    for model_dir in (built.model_dir, built.skyreels_model_dir):
        index = json.loads((model_dir / "model_index.json").read_text())
        assert index["_class_name"] == "HunyuanVideoPipeline"
        assert index["text_encoder"] == ["transformers", "LlamaModel"]
        for sub in ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"):
            assert (model_dir / sub).is_dir(), sub
        # the tokenizers stay in tokenizer*/: nothing is copied into the weights' text_encoder*/
        assert sorted(p.name for p in (model_dir / "text_encoder").iterdir()) == ["config.json", "model.safetensors"]
        assert sorted(p.name for p in (model_dir / "text_encoder_2").iterdir()) == ["config.json", "model.safetensors"]
    assert built.vae_dir == built.model_dir / "vae"
    assert (built.flux_dir / "model_index.json").is_file()
    assert (built.videoalign_ckpt / "model_config.json").is_file() and (built.videoalign_base / "config.json").is_file()
    assert built.videoalign_ckpt.parent == built.videoalign_base.parent == built.root  # beside the pipeline
    for sub in ("prompt_embed", "prompt_attention_mask"):
        assert sorted(p.name for p in (built.skyreels_empty_dir / sub).iterdir()) == ["0.pt"]
    assert not (built.root / ".scratch").exists()
    assert not list(built.root.parent.glob(".fixtures-hunyuan.build-*")), "staging directory left behind"


def test_reused_when_current_rebuilt_when_the_prompts_change(built, patched_tree):
    stamp = built.root / STAMP_NAME
    before = stamp.read_text(), stamp.stat().st_mtime_ns
    prompts = built.root.parent / "prompts.txt"
    again = hy.build_hunyuan_fixtures(built.root, prompts, sys.executable, patched_tree.tree)
    assert again == built and (stamp.read_text(), stamp.stat().st_mtime_ns) == before
    other = built.root.parent / "other-prompts.txt"
    other.write_text("a dog runs on the beach\n")
    rebuilt = hy.build_hunyuan_fixtures(built.root.parent / "fixtures-other", other, sys.executable, patched_tree.tree)
    assert rebuilt.root != built.root and stamp.read_text() == before[0]
    assert rebuilt.root.joinpath(STAMP_NAME).read_text() != before[0]
    assert [e["caption"] for e in json.loads(rebuilt.data_json.read_text())] == ["a dog runs on the beach"]


def test_the_transformers_load_as_the_repo_local_class_with_the_diffusers_weights(checked):
    for name, channels in (("hunyuan_transformer", 16), ("skyreels_transformer", 32)):
        got = checked[name]
        assert got["class"] == "fastvideo.models.hunyuan_hf.modeling_hunyuan.HunyuanVideoTransformer3DModel"
        assert got["same_state"] and got["dtype"] == "torch.float32" and got["in_channels"] == channels
        assert got["params"] < 200_000, got["params"]


def test_the_dataset_is_upstreams_encoding_and_loads_with_upstreams_dataset(checked):
    got = checked["dataset"]
    hidden = hy.LLAMA_CONFIG["hidden_size"]
    assert got["captions"] == list(PROMPTS[:3])  # the Chinese prompt dropped, as upstream does
    # the CLIP's pooled output (padded to the LLaMA's width) first, then the 256 tokens after the crop
    assert got["embeds"] == [3, 1 + hy.TEXT_LEN, hidden] and got["masks"] == [3, hy.TEXT_LEN]
    assert got["dtype"] == got["llm_dtype"] == "torch.float16"  # text_encoder_precision="fp16"
    assert got["mask_dtype"] == "torch.int64" and got["mask_is_a_prefix"]
    assert got["reencoded_equal"]  # upstream's encode_prompt of the captions, bit for bit
    assert got["llm_layers"] >= 3  # hidden_state_skip_layer=2: hidden_states[-3] is a layer's output
    # the crop (crop_start 95) drops exactly the template's system turn: the prompt and <|eot_id|> are left
    assert got["kept"] == [p + "<|eot_id|>" for p in PROMPTS[:3]]
    assert checked["skyreels_dataset"]["empty"] == [[1 + hy.TEXT_LEN, hidden], [hy.TEXT_LEN], 1]  # <|eot_id|> only


def test_skyreels_datasets_are_written_as_its_two_preprocessing_runs_write_them(checked):
    got = checked["skyreels_dataset"]
    assert got["captions"] == list(PROMPTS[:3]) and got["equal_to_hunyuan"]  # the same text encoders
    assert got["empty_json"] == [{"prompt_embed_path": "0.pt", "prompt_attention_mask": "0.pt", "caption": ""}]


def test_the_wrapper_reads_the_tokenizers_where_they_are(checked):
    """preprocess-hunyuan: upstream's wrapper finds each text encoder's tokenizer in the weights'
    tokenizer/ and tokenizer_2/, without its script's `cp tokenizer/*` into the encoders' folders
    (the pipeline directory here holds only the encoders' weights, and is not changed)."""
    assert checked["encoder_without_copy"] == "loaded", checked["encoder_without_copy"]


def test_the_repo_local_transformer_runs_the_trainers_call(checked):
    got = checked["forward"]
    assert "error" not in got, got
    assert got["shape"] == list(LATENT) and got["finite"]
    assert got["prompt_seen"]  # another prompt, another prediction
    assert got["padding_ignored"]  # the attention mask keeps the padded embeddings out


def test_the_skyreels_transformer_takes_the_first_frames_latents(checked):
    got = checked["skyreels_forward"]
    assert "error" not in got, got
    assert got["shape"] == [2, 16, *LATENT[2:]] and got["finite"] and got["cfg_differs"]


def test_the_vae_decodes_five_frames_and_encodes_a_first_frame(checked):
    got = checked["vae"]
    assert got["decoded"] == [1, 3, FRAMES, SIZE, SIZE] and got["finite"]
    assert got["first_frame_latent"] == [1, 16, 1, SIZE // 8, SIZE // 8]
    assert got["params"] < 300_000, got["params"]


def test_load_vae_puts_the_vae_on_the_runs_device(checked):
    """device-backend: upstream's load_vae("hunyuan_hf") ended in .to("cuda"), which fails on a
    machine without CUDA; it now loads onto the run's device (the CPU here)."""
    assert checked["load_vae"] == "loaded", checked["load_vae"]


def test_the_tiny_videoalign_tells_decoded_videos_apart(checked):
    """Eight videos the tiny VAE decodes from random latents get eight VQ scores, a score typically
    (the median deviation from the median) more than 5% of the largest away from the others': with
    the language model's queries and keys at unit deviation its attention saturated, most scores lay
    within a few bfloat16 steps of each other (2.5%), and a smoke's group of two could score alike
    (a step with every advantage 0)."""
    import statistics

    vq = checked["videoalign_vq"]
    assert isinstance(vq, list) and len(set(vq)) == len(vq) == 8, vq
    middle = statistics.median(vq)
    assert statistics.median(abs(v - middle) for v in vq) > 0.05 * max(abs(v) for v in vq), vq


def test_the_flux_pipeline_makes_a_first_frame(checked):
    assert checked["flux"] == [SIZE, SIZE]


def test_the_clip_pooled_projection_fits_the_llamas_width():
    """The transformer reads the pooled CLIP output from the first token's first
    pooled_projection_dim values (encode_prompt pads it to the LLaMA's width)."""
    assert hy.TRANSFORMER_CONFIG["pooled_projection_dim"] == CLIP_TEXT_CONFIG["hidden_size"]
    assert hy.TRANSFORMER_CONFIG["text_embed_dim"] == hy.LLAMA_CONFIG["hidden_size"] >= CLIP_TEXT_CONFIG["hidden_size"]
    assert sum(hy.TRANSFORMER_CONFIG["rope_axes_dim"]) == hy.TRANSFORMER_CONFIG["attention_head_dim"]
