"""records/ of a run (``--record``): what the Flux trainers write, and what ``--replay`` reads.

Layout (the trainer's working directory is the run directory)::

    records/index.json                       the run's description; "steps": complete steps
    records/step_000001/rank_0.safetensors   one file per rank per recorded step
    records/modules/rank_0.safetensors       --record_modules: module outputs of step 1
    records/modules/rank_0.json              {"order": [tensor names in execution order]}

Tensors of a step file (B samples on the rank, S sampling steps, T trained timesteps a
sample; float32 unless said): noise.init (1 or B, 16, h/8, w/8), noise.sde (B, S, tokens, 64)
(with an SDE window of W steps (B, W, tokens, 64), its steps' noise only),
noise.perms int64 (B, S-1), noise.order int64 (K,) (best-of-n's order of the K kept), latents (B, S+1, tokens, 64), log_probs (B, S), images uint8
(B, h, w, 3), rewards (B,), advantages (B,), train.log_prob / train.old_log_prob /
train.ratio / train.loss (B, T), grad_norm (K,) one per optimizer step.

Module records name a tensor ``<prefix>/<module path>`` (prefix transformer, vae or reward;
the root module is the prefix alone; FSDP, checkpoint and torch.compile wrapper names are
dropped from the path), ``.0``, ``.1`` ... for the items of a tuple or list output and
``.<key>`` for a dict's.  Only the first call of a module is kept; "order" is the order in
which the modules' forwards completed.

Self-contained: torch, safetensors and the standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from dancegrpo_port.contract import MODULE_GROUPS as MODULE_PREFIXES
from dancegrpo_port.contract import OPTIONAL_RECORD_NOISE as OPTIONAL_NOISE
from dancegrpo_port.contract import RECORD_NOISE as NOISE
from dancegrpo_port.contract import RECORDS_FORMAT as FORMAT
from dancegrpo_port.contract import REPLAY_FIT, format_steps

ROWS_PER_PAIR = ("train.log_prob", "train.old_log_prob", "train.ratio", "train.loss")
WRAPPER_PARTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def step_path(root, step: int, rank: int) -> Path:
    return Path(root) / f"step_{step:06d}" / f"rank_{rank}.safetensors"


def tensor_shapes(path) -> dict:
    """name -> shape of a safetensors file, from its header (no tensor is read)."""
    with safe_open(str(path), framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def load_noise(root, step: int, rank: int):
    """(init, sde, perms, order) of a recorded step, on the CPU; order None where the trainer
    has no best-of-n."""
    with safe_open(str(step_path(root, step, rank)), framework="pt") as f:
        present = set(f.keys())
        return (*(f.get_tensor(name) for name in NOISE),
                *(f.get_tensor(name) if name in present else None for name in OPTIONAL_NOISE))


def replay_problem(root, fields: dict, rank: int, samples: int, max_step: int) -> str | None:
    """Why ``--replay root`` cannot drive this run (one line), or None."""
    index_path = Path(root) / "index.json"
    try:
        index = json.loads(index_path.read_text())
    except FileNotFoundError:
        return f"--replay {root}: no index.json there (not the records/ of a run made with --record)"
    except (OSError, ValueError) as exc:
        return f"--replay {root}: cannot read index.json ({exc})"
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        return f"--replay {root}: index.json is not records format {FORMAT}"
    differs = [f"{k} {index.get(k)!r} (this run: {fields[k]!r})" for k in REPLAY_FIT if index.get(k) != fields[k]]
    if differs:
        return f"--replay {root} does not fit this run: " + ", ".join(differs)
    missing = sorted(set(range(1, max_step + 1)) - set(index.get("steps") or []))
    if missing:
        return (f"--replay {root}: step(s) {format_steps(missing)} of this run were not recorded "
                f"(recorded: {format_steps(index.get('steps') or []) or 'none'})")
    # The samples and the steps, which the arguments decide; a sample's latent shape is the
    # model's (FLUX's packed latents, Wan's frames, SD's 4 channels): the noise source checks it
    # at its first draw (alignment._same_shape), naming the tensor.
    steps = fields["sampling_steps"]
    window = fields.get("sde_window")  # contract.sde_window_fit: an SDE window's steps alone have SDE noise
    want = {"noise.init": (1 if fields["init_same_noise"] else samples,),
            "noise.sde": (samples, steps if window is None else window[0]), "noise.perms": (samples, steps - 1)}
    for step in range(1, max_step + 1):
        path = step_path(root, step, rank)
        try:
            shapes = tensor_shapes(path)
        except Exception as exc:  # safetensors raises its own error types
            return f"--replay {root}: cannot read {path} ({exc})"
        for name, lead in want.items():
            shape = shapes.get(name)
            if shape is None or tuple(shape[:len(lead)]) != lead:
                return (f"--replay {root}: {name} of step {step} is {shape}, this run needs {lead + ('...',)} "
                        f"({samples} samples a rank: --train_batch_size x --num_generations)")
    return None


def image_tensor(image) -> torch.Tensor:
    """A decoded image (PIL, as upstream's postprocess returns it) as uint8 (h, w, 3)."""
    if isinstance(image, torch.Tensor):
        return image.detach().to("cpu")
    rgb = image.convert("RGB")
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).reshape(rgb.height, rgb.width, 3)


def _stored(tensor: torch.Tensor) -> torch.Tensor:
    """Float tensors as float32, integer ones as int64 (uint8 images stay), on the CPU."""
    tensor = torch.as_tensor(tensor).detach()
    if tensor.dtype == torch.uint8:
        return tensor.to("cpu")
    return tensor.to("cpu", torch.float32 if tensor.is_floating_point() else torch.int64)


def _save(tensors: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.chmod(tmp, 0o666 & ~_umask())  # safetensors creates 0600; records are for reading
    os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_json(data, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


class Recorder:
    """One rank's side of records/: keeps the stages of a recorded step, writes them at its end."""

    def __init__(self, root: Path, rank: int, world_size: int, steps, modules: bool, fields: dict):
        self.root, self.rank, self.world_size, self.steps = Path(root), rank, world_size, steps
        self.modules_wanted = modules
        self.index = dict(fields, steps=[], modules=False)
        self.parts: dict[str, list] = {}
        self.active = False
        self.step = None
        self.module_tensors: dict[str, torch.Tensor] = {}
        self.module_order: list[str] = []
        self.modules_done: set[str] = set()
        self.modules_pending = False
        self.earlier = None  # the index of the run this one may resume (resumed())
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            try:
                self.earlier = json.loads((self.root / "index.json").read_text())
            except (OSError, ValueError):
                pass
            _write_json(self.index, self.root / "index.json")

    def resumed(self, step: int) -> None:
        """A resumed run continues records/: index.json keeps the steps up to ``step`` (later
        ones are done again, their files overwritten)."""
        earlier = self.earlier if isinstance(self.earlier, dict) else {}
        if self.rank != 0:
            return
        self.index["steps"] = sorted(s for s in earlier.get("steps", []) if s <= step)
        self.index["modules"] = bool(earlier.get("modules"))
        _write_json(self.index, self.root / "index.json")

    def begin(self, step: int) -> bool:
        self.step, self.parts = step, {}
        self.active = self.steps is None or step in self.steps
        return self.active

    def add(self, name: str, tensor) -> None:
        if self.active:
            self.parts.setdefault(name, []).append(_stored(tensor))

    def modules_due(self, prefix: str) -> bool:
        return self.modules_wanted and self.step == 1 and prefix not in self.modules_done

    def add_modules(self, prefix: str, capture: "ModuleCapture") -> None:
        self.modules_done.add(prefix)
        for name in capture.order:
            if name not in self.module_tensors:
                self.module_tensors[name] = capture.tensors[name]
                self.module_order.append(name)
        self.modules_pending = True

    def step_tensors(self, noise: dict) -> dict:
        out = dict(noise)
        parts = {k: torch.cat(v) for k, v in self.parts.items()}
        samples = out["noise.sde"].shape[0] if "noise.sde" in out else None
        for name, value in parts.items():
            if name in ROWS_PER_PAIR and samples:
                value = value.reshape(samples, -1)
            out[name] = value
        return out

    def end(self, noise: dict) -> None:
        """Write this rank's file of the step (and step 1's module file); then rank 0 adds
        the step to index.json once every rank's file is there (a collective)."""
        wrote_modules = False
        if self.modules_pending:
            _save(self.module_tensors, self.root / "modules" / f"rank_{self.rank}.safetensors")
            _write_json({"order": self.module_order}, self.root / "modules" / f"rank_{self.rank}.json")
            self.modules_pending, wrote_modules = False, True
            self.module_tensors = {}
        if self.active:
            _save(self.step_tensors(noise), step_path(self.root, self.step, self.rank))
        self.parts, was_active, self.active = {}, self.active, False
        if not (was_active or wrote_modules):
            return
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.rank == 0:
            ranks = range(self.world_size)
            if was_active and all(step_path(self.root, self.step, r).is_file() for r in ranks):
                self.index["steps"] = sorted(set(self.index["steps"]) | {self.step})
            if wrote_modules and all((self.root / "modules" / f"rank_{r}.json").is_file() for r in ranks):
                self.index["modules"] = True
            _write_json(self.index, self.root / "index.json")


def _flatten(name: str, output):
    """(name, tensor) of a module output: tensors, tuples/lists (.0, .1 ...), dicts (.key)."""
    if isinstance(output, torch.Tensor):
        yield name, output
    elif isinstance(output, (tuple, list)):
        for i, item in enumerate(output):
            yield from _flatten(f"{name}.{i}", item)
    elif isinstance(output, dict):
        for key, item in output.items():
            yield from _flatten(f"{name}.{key}", item)


def unwrapped(path: str) -> str:
    """A module path without FSDP, checkpoint and torch.compile wrapper parts."""
    return ".".join(p for p in path.split(".") if p and p not in WRAPPER_PARTS)


class ModuleCapture:
    """Forward hooks on every module of ``root``: the output of each module's first call.

    A module is named by the path it is called through: diffusers shares one activation
    module between blocks, so the name comes from the caller on the stack of running
    modules (the parent that holds it), and only without one from its first path in the
    model.  A wrapper's output comes after the one of what it wraps, under the same name,
    so the wrapped module's is the one kept."""

    def __init__(self, prefix: str, root):
        if not isinstance(root, torch.nn.Module):  # e.g. HPSv3's inferencer holds its model
            root = getattr(root, "model", None)
        self.prefix = prefix
        self.tensors: dict[str, torch.Tensor] = {}
        self.order: list[str] = []
        self.handles = []
        self.stack: list[tuple[torch.nn.Module, str]] = []
        if isinstance(root, torch.nn.Module):
            self.paths = {id(m): path for path, m in root.named_modules()}  # first path of each module
            for module in {id(m): m for m in root.modules()}.values():
                self.handles.append(module.register_forward_pre_hook(self._enter))
                self.handles.append(module.register_forward_hook(self._leave))

    def _enter(self, module, inputs):
        path = self.paths[id(module)]
        if self.stack:
            parent, parent_path = self.stack[-1]
            name = next((n for n, child in parent._modules.items() if child is module), None)
            if name is not None:
                path = f"{parent_path}.{name}" if parent_path else name
        self.stack.append((module, path))

    def _leave(self, module, inputs, output):
        if not self.stack:  # hooks added while a forward was running
            return
        path = unwrapped(self.stack.pop()[1])
        for key, tensor in _flatten(f"{self.prefix}/{path}" if path else self.prefix, output):
            if key not in self.tensors:
                self.tensors[key] = tensor.detach().to("cpu", torch.float32).clone()
                self.order.append(key)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
