"""Every rank's trained weights, digested (``--weights_digest``).

Added to the upstream tree by dancegrpo-npu (overlay).  Ranks that train one model end with
the same weights; ranks that each train their own copy (upstream's Wan2.1 trainer has no FSDP,
DDP or gradient all-reduce, and saves rank 0's copy only) do not.  With ``--weights_digest``
each rank writes ``./weights/rank<R>.json`` after training: the sha256 of every tensor of its
model's full state dict (gathered under FSDP, so a collective: every rank calls it), which the
smoke compares across ranks.
"""

from __future__ import annotations

import hashlib
import json
import os

from dancegrpo_port.feature import Feature


def add_arguments(parser) -> None:
    parser.add_argument(
        "--weights_digest",
        action="store_true",
        help="after training, write ./weights/rank<R>.json: the sha256 of each of this rank's trained "
        "tensors (full tensors, gathered under FSDP), to check that every rank holds the same weights",
    )


def digests(model) -> dict[str, str]:
    """name -> sha256 of the tensor's float32 bytes, from the model's full state dict."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    out = {}
    for name, tensor in sorted(state.items()):
        data = tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        out[name] = hashlib.sha256(data).hexdigest()
    return out


class WeightDigest(Feature):
    def __init__(self, rank: int, enabled: bool, directory: str = "./weights"):
        self.rank, self.enabled, self.directory = rank, enabled, directory

    def trained_model(self, model) -> None:
        if not self.enabled:
            return
        found = digests(model)
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(found, f, indent=0, sort_keys=True)
        os.replace(path + ".tmp", path)
