"""videoalign-on-every-device: upstream's VideoVLMRewardInference, from the patched tree, loads a
tiny VideoAlign checkpoint laid out as upstream loads it (dancegrpo_npu.trainers.hunyuan.videoalign)
on the CPU, with SDPA, and scores videos held in memory; a reward that raises, or is not finite,
is one line naming the reward, the sample and the cause (dancegrpo_port.videoalign.score).

The overlay's pieces on their own: tests/overlay/test_videoalign.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import require_video_extra
from snippet import run_snippet

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

SRC = Path(__file__).resolve().parents[2] / "src"

SCORE = r"""
import json, os, sys
from pathlib import Path

import av
import numpy as np
import torch

from dancegrpo_npu.trainers.hunyuan.videoalign import build

_, ckpt = build(Path("."))  # ./Qwen2-VL-2B-Instruct and ./videoalign_ckpt, where upstream looks

from fastvideo.models.videoalign.inference import VideoVLMRewardInference
from dancegrpo_port import videoalign

out = {}
inferencer = VideoVLMRewardInference(str(ckpt), device="cpu", dtype=torch.bfloat16)
model = inferencer.model.base_model.model  # the LoRA-wrapped Qwen2VLRewardModelBT
out["attn"] = [model.config._attn_implementation, type(model.model.layers[0].self_attn).__name__,
               type(model.visual.blocks[0].attn).__name__]
out["device"] = [str(inferencer.device), sorted({str(p.device) for p in model.parameters()})]

rng = np.random.default_rng(5)
clips = [rng.random((8, 64, 80, 3), dtype=np.float32) for _ in range(3)]  # postprocess_video's (F, H, W, C)
clips += [np.zeros((8, 64, 80, 3), np.float32), np.ones((8, 64, 80, 3), np.float32)]
videos = [videoalign.Frames(clip, fps=8) for clip in clips]
prompts = ["A cat walks on the grass.", "A red car drives along the coast at sunset."] * 2 + ["The camera remains still."]
names = [f"rank0_sample{i}" for i in range(len(videos))]
out["first"] = videoalign.score(inferencer, videos, prompts, names)
out["again"] = videoalign.score(inferencer, videos, prompts, names)
out["reloaded"] = videoalign.score(VideoVLMRewardInference(str(ckpt), device="cpu", dtype=torch.bfloat16),
                                   videos, prompts, names)

# the same frames from a file that keeps them bit for bit (FFV1), read by PyAV
frames = (clips[0] * 255).astype(np.uint8)
with av.open("clip.mkv", "w") as container:
    stream = container.add_stream("ffv1", rate=8)
    stream.width, stream.height, stream.pix_fmt = 80, 64, "bgr0"
    for frame in frames:
        container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
    container.mux(stream.encode())
path = os.path.abspath("clip.mkv")
out["file"] = videoalign.score(inferencer, [path], [prompts[0]], ["clip.mkv"])

def error_of(*args, **kwargs):
    try:
        videoalign.score(*args, **kwargs)
    except videoalign.RewardError as error:
        return str(error)
    return None

# the video reader raises: upstream's torchvision reader, asked for, on a torchvision without read_video
os.environ["FORCE_QWENVL_VIDEO_READER"] = "torchvision"
out["reader_error"] = error_of(inferencer, [path], [prompts[0]], ["rank0_sample3"])
del os.environ["FORCE_QWENVL_VIDEO_READER"]

# the model's forward raises
def broken(*args, **kwargs):
    raise RuntimeError("NPU out of memory. Tried to allocate 2.00 GiB\n(more lines of the allocator)")
inferencer.model.forward = broken
out["forward_error"] = error_of(inferencer, videos[:2], prompts[:2], names[:2])
fallback = videoalign.UpstreamFallback()
out["fallback"] = [videoalign.score(inferencer, videos[:2], prompts[:2], names[:2], fallback=fallback),
                   fallback.metrics()]
del inferencer.model.forward

# a reward that is not finite
with torch.no_grad():
    model.rm_head.weight.fill_(float("nan"))
out["nan_error"] = error_of(inferencer, videos[:1], prompts[:1], names[:1])
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def scored(patched_tree, tmp_path_factory):
    require_video_extra()
    tmp = tmp_path_factory.mktemp("videoalign")
    proc = run_snippet(SCORE, tmp, [str(SRC), str(patched_tree.tree)], {"DANCEGRPO_DEVICE": "cpu"}, timeout=600)
    line = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert line, proc.stdout + proc.stderr
    return json.loads(line[-1][len("RESULT "):])


def test_the_reward_loads_on_the_cpu_with_sdpa(scored):
    assert scored["attn"] == ["sdpa", "Qwen2VLSdpaAttention", "VisionSdpaAttention"]
    assert scored["device"] == ["cpu", ["cpu"]]


def test_videos_in_memory_get_finite_deterministic_rewards(scored):
    first = scored["first"]
    assert len(first) == 5
    assert all(set(r) == {"VQ", "MQ", "TA", "Overall"} and all(math.isfinite(v) for v in r.values()) for r in first)
    assert all(math.isclose(r["Overall"], r["VQ"] + r["MQ"] + r["TA"]) for r in first)
    assert scored["again"] == first  # the same inferencer twice
    assert scored["reloaded"] == first  # a second load of the checkpoint
    # the frames and the prompt are seen: not one constant
    assert len({json.dumps(r, sort_keys=True) for r in first}) == 5


def test_a_file_read_with_pyav_scores_as_its_frames_in_memory(scored):
    assert scored["file"] == scored["first"][:1]


def test_a_reader_that_raises_is_one_line_naming_the_reward_the_sample_and_the_cause(scored):
    assert scored["reader_error"] == ("VideoAlign reward failed on sample rank0_sample3: "
                                      "AttributeError: module 'torchvision.io' has no attribute 'read_video'")


def test_a_forward_that_raises_is_one_line_and_upstreams_minus_one_only_when_asked(scored):
    assert scored["forward_error"] == ("VideoAlign reward failed on sample rank0_sample0: "
                                       "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB")
    rewards, metrics = scored["fallback"]
    assert rewards == [{"VQ": -1.0, "MQ": -1.0, "TA": -1.0, "Overall": -1.0}] * 2
    assert metrics == {"reward_replaced": 2}


def test_a_reward_that_is_not_finite_is_an_error(scored):
    assert scored["nan_error"] == ("VideoAlign reward failed on sample rank0_sample0: "
                                   "not finite: VQ=nan, MQ=nan, TA=nan, Overall=nan")
