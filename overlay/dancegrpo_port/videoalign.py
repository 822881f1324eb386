"""VideoAlign, the video reward of the HunyuanVideo and SkyReels-I2V trainers, on every device.

Upstream's ``fastvideo/models/videoalign`` (a Qwen2-VL-2B with a reward head,
``VideoVLMRewardInference``) runs on CUDA hosts only:

- it loads the model with ``attn_implementation="flash_attention_2"``, which stops the load
  where flash-attn 2 is not installed (the NPU, the CPU, any host without the CUDA wheel);
- it reads each video back from the mp4 file the trainer has just written, with
  ``torchvision.io.read_video`` (which torchvision 0.29 no longer has) or ``decord`` (no aarch64 wheel);
- the trainers build it with ``device=f'cuda:{device}'``;
- the trainers catch any exception of the reward and score the sample -1.0: the rewards of a
  step become constant, the advantages zero, and the run "works" and learns nothing.

The patch videoalign-on-every-device holds the call sites in ``inference.py`` and
``vision_process.py``; the logic is here:

- :func:`device` - the device the caller gives (a ``torch.device``, an index or a string),
  else the run's (``dancegrpo_port.device``); a ``cuda`` device on an NPU run is the NPU of that
  index, as transfer_to_npu makes it.
- :func:`attention` - flash-attn 2 where transformers can run it on that device (CUDA with the
  flash_attn wheel; the NPU where transformers maps flash attention to the NPU's kernel, which
  4.46.1 does not), else SDPA.  Same weights, same math; only the kernel differs.
- :class:`Frames` - a video in memory, as the trainers hold it after the VAE decode; scored
  without the codec round trip.  A path is still read, with PyAV (wheels for x86-64 and
  aarch64) unless ``FORCE_QWENVL_VIDEO_READER`` (upstream's variable) names one of upstream's
  readers.  Frames are sampled as upstream's readers sample them (:func:`frame_indices`).
- :func:`score` - what the trainers call in place of their try/except: the rewards of each
  sample, or :class:`RewardError`, one line naming the reward, the sample and the cause.
  Upstream's -1.0 is kept only when asked for (:class:`UpstreamFallback`), which counts the
  samples it replaced.

Self-contained: the standard library and torch; numpy and PyAV only where frames are
converted or a file is read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

REWARD = "VideoAlign"
READER_ENV = "FORCE_QWENVL_VIDEO_READER"  # upstream's: "torchvision" or "decord"
PYAV = "pyav"
KEYS = ("VQ", "MQ", "TA", "Overall")  # what VideoVLMRewardInference.reward returns per sample
UPSTREAM_VALUE = -1.0  # what upstream's trainers score a sample whose reward raised
# Where upstream reads VideoAlign, relative to the directory the trainer runs in (hard-coded
# there; the trainers' --videoalign_ckpt and --videoalign_base_model, with these defaults).
CKPT = "./videoalign_ckpt"
BASE_MODEL = "./Qwen2-VL-2B-Instruct"


class RewardError(RuntimeError):
    """A reward could not be computed for a sample: the step cannot go on with it."""

    def __init__(self, reward: str, sample: str, cause: str):
        self.reward, self.sample, self.cause = reward, sample, cause
        super().__init__(f"{reward} reward failed on sample {sample}: {cause}")


def built_on_host():
    """Around VideoAlign's load: the model is built on the CPU and moved to the device after, on
    every device, so strict mode takes the load's CPU tensors for host tensors
    (``strict_mode.host_side``)."""
    from dancegrpo_port.strict_mode import host_side

    return host_side()


def add_arguments(parser) -> None:
    """The trainers' flags for VideoAlign's files."""
    parser.add_argument("--videoalign_ckpt", type=str, default=CKPT,
                        help="the VideoAlign checkpoint (model_config.json, checkpoint-*/) (default: %(default)s)")
    parser.add_argument("--videoalign_base_model", type=str, default=BASE_MODEL,
                        help="the Qwen2-VL-2B-Instruct VideoAlign is trained from: its processor and base weights "
                        "(default: %(default)s)")


# ---- the device and the attention --------------------------------------------------------------


def device(requested: Any = None) -> torch.device:
    """The device VideoAlign runs on: ``requested`` (torch.device, int index, or string), else
    the run's current device.  Upstream's ``cuda`` (the trainers' ``f'cuda:{device}'``) means the
    run's device: the NPU of that index on an NPU run (as transfer_to_npu maps it), the CPU on a
    CPU run."""
    if requested is None:
        from dancegrpo_port.device import current_device

        return current_device()
    if isinstance(requested, int):
        from dancegrpo_port.device import accelerator

        kind = accelerator().kind
        return torch.device("cpu") if kind == "cpu" else torch.device(kind, requested)
    chosen = torch.device(requested)
    if chosen.type == "cuda":
        from dancegrpo_port.device import accelerator

        kind = accelerator().kind
        if kind == "npu":
            return torch.device("npu", chosen.index)
        if kind == "cpu":
            return torch.device("cpu")
    return chosen


def transformers_maps_npu_flash_attention() -> bool:
    """Whether this transformers runs ``flash_attention_2`` on the NPU through torch_npu's
    kernel (its ``integrations.npu_flash_attention``; not in 4.46.1)."""
    import importlib.util

    try:
        return importlib.util.find_spec("transformers.integrations.npu_flash_attention") is not None
    except ModuleNotFoundError:
        return False


def attention(on: torch.device | str) -> str:
    """The ``attn_implementation`` for a model on ``on``: ``flash_attention_2`` where transformers
    can run it there, else ``sdpa`` (upstream forces ``flash_attention_2``)."""
    kind = on.type if isinstance(on, torch.device) else str(on).split(":")[0]  # "npu" needs torch_npu to parse
    if kind == "npu":
        return "flash_attention_2" if transformers_maps_npu_flash_attention() else "sdpa"
    if kind == "cuda":
        from transformers.utils import is_flash_attn_2_available

        return "flash_attention_2" if is_flash_attn_2_available() else "sdpa"
    return "sdpa"


def disable_flash_attn2(on: torch.device | str) -> bool:
    """Upstream's ``TrainingConfig.disable_flash_attn2`` for a model on ``on``: its
    ``create_model_and_processor`` takes ``sdpa`` when it is set."""
    return attention(on) != "flash_attention_2"


# ---- videos: in memory, or read from a file ----------------------------------------------------


@dataclass(frozen=True)
class Frames:
    """A video in memory: ``frames`` is (T, H, W, 3) RGB, a numpy array or a tensor, uint8 in
    0..255 or floating point in 0..1 (what diffusers' ``postprocess_video`` gives and
    ``export_to_video`` takes); ``fps`` is its frame rate (the trainers' ``--fps``, what the
    mp4 file would say), which sampling at the configuration's fps needs."""

    frames: Any
    fps: float

    def __post_init__(self):
        if not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"Frames: fps must be a positive number, got {self.fps!r}")


def is_frames(video: Any) -> bool:
    return isinstance(video, Frames)


def video_source(video: Any) -> Any:
    """What upstream's chat message holds for ``video``: a path becomes upstream's
    ``file://PATH``; :class:`Frames` stay in memory."""
    if isinstance(video, Frames):
        return video
    if isinstance(video, (str, os.PathLike)):
        return f"file://{os.fspath(video)}"
    raise TypeError(f"a VideoAlign video is a file path or dancegrpo_port.videoalign.Frames(frames, fps), "
                    f"not {type(video).__name__}")


def frames_tchw_uint8(frames: Any) -> torch.Tensor:
    """(T, H, W, 3) frames as the (T, 3, H, W) uint8 tensor upstream's readers return.  Floating
    point frames are scaled by 255 and truncated to uint8, as ``export_to_video`` writes them, so
    the model sees what it would have read from a lossless file."""
    if not isinstance(frames, torch.Tensor):
        import numpy as np

        frames = torch.from_numpy(np.ascontiguousarray(frames))
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be (T, H, W, 3) RGB, got shape {tuple(frames.shape)}")
    frames = frames.detach().cpu()
    if frames.dtype != torch.uint8:
        if not frames.is_floating_point():
            raise ValueError(f"frames must be uint8 (0..255) or floating point (0..1), got {frames.dtype}")
        frames = (frames.float() * 255).to(torch.uint8)  # truncates, as (frame * 255).astype(np.uint8)
    return frames.permute(0, 3, 1, 2).contiguous()


def read_pyav(path: str, start: float = 0.0, end: float | None = None) -> tuple[torch.Tensor, float]:
    """Every frame of ``path``'s first video stream between ``start`` and ``end`` seconds, as a
    (T, 3, H, W) uint8 tensor, and the stream's average frame rate."""
    import av
    import numpy as np

    if path.startswith("file://"):
        path = path[len("file://"):]
    with av.open(path) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        frames = []
        for frame in container.decode(stream):
            at = frame.time
            if at is not None and (at < start or (end is not None and at > end)):
                continue
            frames.append(frame.to_ndarray(format="rgb24"))
    if not frames:
        raise ValueError(f"no video frames in {path}")
    if fps <= 0:
        raise ValueError(f"{path} does not say its frame rate")
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous(), fps


def frame_indices(ele: dict, total_frames: int, video_fps: float, smart_nframes: Callable) -> list[int]:
    """The frames upstream's readers keep (``_read_video_torchvision``/``_read_video_decord``):
    ``uniform`` takes ``smart_nframes`` frames evenly; ``multi_pts`` takes 4 runs of 6 frames
    from the video sampled at 8 fps."""
    sample_type = ele.get("sample_type", "uniform")
    if sample_type == "uniform":
        nframes = smart_nframes(ele, total_frames=total_frames, video_fps=video_fps)
        return torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
    if sample_type == "multi_pts":
        frames_each_pts, num_pts, fps = 6, 4, 8
        nframes = int(total_frames * fps // video_fps)
        frames_idx = torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
        start_pt = int(frames_each_pts // 2)
        end_pt = int(nframes - frames_each_pts // 2 - 1)
        pts = torch.linspace(start_pt, end_pt, num_pts).round().long().tolist()
        idx = []
        for pt in pts:
            idx.extend(frames_idx[pt - frames_each_pts // 2: pt + frames_each_pts // 2])
        return idx
    raise ValueError(f"unknown sample_type {sample_type!r} (uniform or multi_pts)")


def reader_backend(readers: dict) -> str:
    """``FORCE_QWENVL_VIDEO_READER`` when set (one of upstream's readers), else PyAV."""
    chosen = os.environ.get(READER_ENV) or PYAV
    if chosen != PYAV and chosen not in readers:
        raise ValueError(f"{READER_ENV}={chosen!r} names no video reader: {', '.join([PYAV, *readers])}")
    return chosen


def read_video(ele: dict, readers: dict, smart_nframes: Callable) -> torch.Tensor:
    """The sampled frames of ``ele["video"]`` as a (T, 3, H, W) uint8 tensor, what upstream's
    ``fetch_video`` resizes next: :class:`Frames` from memory, a path with PyAV (or the upstream
    reader ``FORCE_QWENVL_VIDEO_READER`` names, which samples itself)."""
    video = ele["video"]
    if isinstance(video, Frames):
        frames, fps = frames_tchw_uint8(video.frames), float(video.fps)
    else:
        backend = reader_backend(readers)
        if backend != PYAV:
            return readers[backend](ele)
        frames, fps = read_pyav(video, ele.get("video_start", 0.0), ele.get("video_end"))
    return frames[frame_indices(ele, frames.shape[0], fps, smart_nframes)]


# ---- scoring: an error is an error ------------------------------------------------------------


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``: what a log line and a failed run's reason can hold."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


@dataclass
class UpstreamFallback:
    """Upstream's behaviour, only when asked for: a sample whose reward raised scores -1.0 (every
    key), and :attr:`replaced` counts those samples for the run's metrics (``reward_replaced``),
    so a run whose rewards are upstream's constant says so."""

    replaced: int = 0
    causes: list[str] = field(default_factory=list)

    def replace(self, error: RewardError) -> dict[str, float]:
        self.replaced += 1
        self.causes.append(str(error))
        print(f"videoalign: upstream's fallback: {error}; its reward is {UPSTREAM_VALUE}", flush=True)
        return {key: UPSTREAM_VALUE for key in KEYS}

    def metrics(self) -> dict[str, int]:
        return {"reward_replaced": self.replaced}


def score(inferencer, videos: Sequence[Any], prompts: Sequence[str], names: Sequence[str], *,
          reward: str = REWARD, fallback: UpstreamFallback | None = None, use_norm: bool = True,
          **reward_kwargs) -> list[dict[str, float]]:
    """Each video's rewards (``{"VQ", "MQ", "TA", "Overall"}``), one sample at a time as upstream
    scores them (``inferencer.reward([video], [prompt], use_norm=use_norm)``).  A sample whose
    reward raises, or is not finite, is a :class:`RewardError` naming ``reward``, the sample's
    name and the cause; with ``fallback`` it is scored as upstream does and counted instead."""
    if not (len(videos) == len(prompts) == len(names)):
        raise ValueError(f"score: {len(videos)} videos, {len(prompts)} prompts, {len(names)} names")
    out = []
    for video, prompt, name in zip(videos, prompts, names):
        try:
            with torch.no_grad():
                got = inferencer.reward([video], [prompt], use_norm=use_norm, **reward_kwargs)[0]
            bad = [f"{key}={value}" for key, value in got.items() if not math.isfinite(float(value))]
            if bad:
                raise RewardError(reward, str(name), f"not finite: {', '.join(bad)}")
        except RewardError as error:
            if fallback is None:
                raise
            got = fallback.replace(error)
        except Exception as error:  # noqa: BLE001  (each becomes one line naming the sample)
            failed = RewardError(reward, str(name), one_line(error))
            if fallback is None:
                raise failed from error
            got = fallback.replace(failed)
        out.append(got)
    return out
