"""overlay/dancegrpo_port/videoalign.py: VideoAlign's device and attention, its videos in memory or
read with PyAV, sampled as upstream samples them, and scores whose errors are errors.

The upstream class through the patched tree, on a tiny checkpoint: tests/patches/test_videoalign_reward.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import require_video_extra
from overlay_runner import OVERLAY, run_python  # noqa: F401  (puts overlay/ on sys.path; a fixture)

from dancegrpo_port import videoalign  # noqa: E402

# ---- the attention ------------------------------------------------------------------------------


def test_the_cpu_gets_sdpa():
    assert videoalign.attention("cpu") == "sdpa"
    assert videoalign.attention(torch.device("cpu")) == "sdpa"
    assert videoalign.disable_flash_attn2("cpu") is True


def test_cuda_gets_flash_attention_2_only_where_transformers_can_run_it(monkeypatch):
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    assert videoalign.attention("cuda:0") == "sdpa"
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    assert videoalign.attention("cuda:0") == "flash_attention_2"
    assert videoalign.disable_flash_attn2("cuda:0") is False


def test_the_npu_gets_the_npu_kernel_where_transformers_maps_one(monkeypatch):
    # transformers 4.46.1 (the default set) has no NPU flash attention: SDPA
    assert videoalign.transformers_maps_npu_flash_attention() is False
    assert videoalign.attention("npu:0") == "sdpa"
    monkeypatch.setattr(videoalign, "transformers_maps_npu_flash_attention", lambda: True)
    assert videoalign.attention("npu:0") == "flash_attention_2"


# ---- the device ---------------------------------------------------------------------------------


def test_the_device_is_the_callers_else_the_runs(run_python):
    proc = run_python("""
        import torch
        from dancegrpo_port import videoalign
        print(videoalign.device(None), videoalign.device("cpu"), videoalign.device(torch.device("cpu")),
              videoalign.device("cuda:0"), videoalign.device(0))
    """, env={"DANCEGRPO_DEVICE": "cpu"})
    # upstream's 'cuda' (the trainers' f'cuda:{device}') is the run's device: the CPU here
    assert proc.stdout.split() == ["cpu"] * 5


@pytest.mark.fake_npu
def test_on_an_npu_run_upstreams_cuda_is_the_npu_of_that_index(run_python):
    proc = run_python("""
        from dancegrpo_port import device, videoalign
        device.activate()
        print(videoalign.device("cuda:1"), videoalign.device(1), videoalign.device("cpu"))
    """, env={"DANCEGRPO_DEVICE": "npu", "ASCEND_RT_VISIBLE_DEVICES": "0,1"}, fake_npu=True)
    assert proc.stdout.split() == ["npu:1", "npu:1", "cpu"]


# ---- frames -------------------------------------------------------------------------------------


def test_float_frames_are_quantized_as_export_to_video_writes_them():
    rng = np.random.default_rng(0)
    frames = rng.random((3, 5, 7, 3), dtype=np.float32)
    frames[0, 0, 0] = [0.0, 1.0, 0.9999]
    got = videoalign.frames_tchw_uint8(frames)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (3, 3, 5, 7)
    want = (frames * 255).astype(np.uint8)  # diffusers' export_to_video
    assert np.array_equal(got.permute(0, 2, 3, 1).numpy(), want)
    assert got[0, :, 0, 0].tolist() == [0, 255, 254]
    # a tensor (on any device) and uint8 frames give the same
    assert torch.equal(videoalign.frames_tchw_uint8(torch.from_numpy(frames)), got)
    assert torch.equal(videoalign.frames_tchw_uint8(want), got)


@pytest.mark.parametrize("frames, says", [
    (np.zeros((3, 4, 4), np.uint8), "(T, H, W, 3)"),
    (np.zeros((2, 3, 4, 4), np.uint8), "(T, H, W, 3)"),
    (np.zeros((2, 4, 4, 3), np.int64), "uint8 (0..255) or floating point"),
])
def test_frames_of_another_layout_or_type_are_refused_in_one_line(frames, says):
    with pytest.raises(ValueError) as refused:
        videoalign.frames_tchw_uint8(frames)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_frames_need_their_frame_rate():
    with pytest.raises(ValueError, match="fps must be a positive number"):
        videoalign.Frames(np.zeros((2, 4, 4, 3), np.uint8), fps=0)
    assert videoalign.video_source("/a/b.mp4") == "file:///a/b.mp4"  # upstream's
    frames = videoalign.Frames(np.zeros((2, 4, 4, 3), np.uint8), fps=8)
    assert videoalign.video_source(frames) is frames
    with pytest.raises(TypeError, match="a file path or dancegrpo_port.videoalign.Frames"):
        videoalign.video_source(np.zeros((2, 4, 4, 3), np.uint8))


def upstream_smart_nframes(ele, total_frames, video_fps):
    """vision_process.smart_nframes, for the sampling tests (FRAME_FACTOR 2, 4..768 frames at fps)."""
    if "nframes" in ele:
        nframes = round(ele["nframes"] / 2) * 2
    else:
        fps = ele.get("fps", 2.0)
        min_frames = math.ceil(ele.get("min_frames", 4) / 2) * 2
        max_frames = math.floor(ele.get("max_frames", min(768, total_frames)) / 2) * 2
        nframes = min(max(total_frames / video_fps * fps, min_frames), max_frames)
        nframes = round(nframes / 2) * 2
    return min(nframes, total_frames)


def test_frames_are_sampled_as_upstreams_readers_sample_them():
    # uniform at 2 fps: 48 frames at 8 fps are 6 s, 12 frames, evenly
    ele = {"fps": 2.0, "sample_type": "uniform"}
    assert videoalign.frame_indices(ele, 48, 8.0, upstream_smart_nframes) == \
        torch.linspace(0, 47, 12).round().long().tolist()
    assert videoalign.frame_indices({"nframes": 4, "sample_type": "uniform"}, 9, 8.0, upstream_smart_nframes) == \
        [0, 3, 5, 8]
    # multi_pts: 4 runs of 6 frames of the video at 8 fps
    idx = videoalign.frame_indices({"sample_type": "multi_pts"}, 64, 16.0, upstream_smart_nframes)
    assert len(idx) == 24 and idx == sorted(idx)
    with pytest.raises(ValueError, match="unknown sample_type"):
        videoalign.frame_indices({"sample_type": "random"}, 8, 8.0, upstream_smart_nframes)


def write_lossless(path, frames_thwc: np.ndarray, fps: int) -> None:
    """``frames_thwc`` (uint8) in a file that gives them back bit for bit (FFV1, RGB)."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames_thwc.shape[2], frames_thwc.shape[1], "bgr0"
        for frame in frames_thwc:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


def test_a_path_is_read_with_pyav_and_sampled_as_frames_in_memory_are(tmp_path, monkeypatch):
    require_video_extra()
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (10, 16, 24, 3), dtype=np.uint8)
    path = tmp_path / "clip.mkv"
    write_lossless(path, frames, fps=5)
    read, fps = videoalign.read_pyav(f"file://{path}")
    assert fps == 5.0 and torch.equal(read, torch.from_numpy(frames).permute(0, 3, 1, 2))

    monkeypatch.delenv(videoalign.READER_ENV, raising=False)
    ele = {"fps": 2.0, "sample_type": "uniform"}
    from_file = videoalign.read_video({**ele, "video": f"file://{path}"}, {}, upstream_smart_nframes)
    from_memory = videoalign.read_video({**ele, "video": videoalign.Frames(frames, fps=5)}, {},
                                        upstream_smart_nframes)
    assert tuple(from_file.shape) == (4, 3, 16, 24) and torch.equal(from_file, from_memory)


def test_forced_reader_is_upstreams_and_an_unknown_one_is_refused(monkeypatch):
    calls = []
    readers = {"torchvision": lambda ele: calls.append(ele) or torch.zeros(2, 3, 4, 4, dtype=torch.uint8)}
    monkeypatch.setenv(videoalign.READER_ENV, "torchvision")
    videoalign.read_video({"video": "file:///x.mp4"}, readers, upstream_smart_nframes)
    assert calls == [{"video": "file:///x.mp4"}]
    monkeypatch.setenv(videoalign.READER_ENV, "opencv")
    with pytest.raises(ValueError, match=r"FORCE_QWENVL_VIDEO_READER='opencv' names no video reader: pyav, torchvision"):
        videoalign.read_video({"video": "file:///x.mp4"}, readers, upstream_smart_nframes)
    # in-memory frames never go through a reader
    got = videoalign.read_video({"video": videoalign.Frames(np.zeros((4, 4, 4, 3), np.uint8), fps=2),
                                 "nframes": 2, "sample_type": "uniform"}, readers, upstream_smart_nframes)
    assert tuple(got.shape) == (2, 3, 4, 4) and len(calls) == 1


# ---- scores -------------------------------------------------------------------------------------


class FakeInferencer:
    """VideoVLMRewardInference.reward's contract: one dict a video; raises for the videos named."""

    def __init__(self, raise_on=(), value=0.5):
        self.raise_on, self.value, self.calls = set(raise_on), value, []

    def reward(self, videos, prompts, use_norm=True):
        assert len(videos) == len(prompts) == 1
        self.calls.append((videos[0], prompts[0], use_norm, torch.is_grad_enabled()))
        if videos[0] in self.raise_on:
            raise RuntimeError(f"reading {videos[0]} failed\nTraceback-ish second line")
        return [{"VQ": self.value, "MQ": 2.0, "TA": 3.0, "Overall": self.value + 5.0}]


def test_score_gives_each_samples_rewards_without_gradients():
    fake = FakeInferencer()
    got = videoalign.score(fake, ["a", "b"], ["p", "q"], ["r0_s0", "r0_s1"])
    assert got == [{"VQ": 0.5, "MQ": 2.0, "TA": 3.0, "Overall": 5.5}] * 2
    assert fake.calls == [("a", "p", True, False), ("b", "q", True, False)]


def test_a_reward_that_raises_is_one_line_naming_the_reward_the_sample_and_the_cause():
    with pytest.raises(videoalign.RewardError) as failed:
        videoalign.score(FakeInferencer(raise_on={"b"}), ["a", "b", "c"], ["p"] * 3, ["s0", "s1", "s2"])
    assert str(failed.value) == "VideoAlign reward failed on sample s1: RuntimeError: reading b failed"
    assert (failed.value.reward, failed.value.sample) == ("VideoAlign", "s1")
    assert isinstance(failed.value.__cause__, RuntimeError)


def test_a_reward_that_is_not_finite_is_an_error():
    with pytest.raises(videoalign.RewardError) as failed:
        videoalign.score(FakeInferencer(value=float("nan")), ["a"], ["p"], ["s0"], reward="VideoAlign MQ")
    assert str(failed.value) == "VideoAlign MQ reward failed on sample s0: not finite: VQ=nan, Overall=nan"


def test_upstreams_minus_one_only_when_asked_and_counted(capsys):
    fallback = videoalign.UpstreamFallback()
    got = videoalign.score(FakeInferencer(raise_on={"b"}, value=float("nan")), ["a", "b"], ["p"] * 2, ["s0", "s1"],
                           fallback=fallback)
    assert got == [{key: -1.0 for key in videoalign.KEYS}] * 2
    assert fallback.replaced == 2 and fallback.metrics() == {"reward_replaced": 2}
    assert fallback.causes == ["VideoAlign reward failed on sample s0: not finite: VQ=nan, Overall=nan",
                               "VideoAlign reward failed on sample s1: RuntimeError: reading b failed"]
    assert capsys.readouterr().out.count("upstream's fallback") == 2


def test_score_refuses_lists_of_different_lengths():
    with pytest.raises(ValueError, match="2 videos, 1 prompts, 2 names"):
        videoalign.score(FakeInferencer(), ["a", "b"], ["p"], ["s0", "s1"])
