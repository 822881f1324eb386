"""The dataset each compared run read, as its records index keeps it (``contract.RECORD_DATASET``,
written by the overlay's ``dataset_index.digest``): the index file's path, sha256 and rows, and
the sha256 of the tensor files it names (as many as the digest read).

Two runs with bit-equal noise that read different prompts' embeddings diverge at step 1's
latents whatever their devices do; ``compare`` shows each run's dataset and says when they
differ, so that such a divergence points at the data, not at the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from dancegrpo_npu.contract import RECORD_DATASET

NOT_RECORDED = "not recorded (records made before runs kept their dataset's digest, or a trainer without a dataset file)"


@dataclass(frozen=True)
class Datasets:
    a: dict | None  # RUN_A's digest, None when its records hold none
    b: dict | None
    same: bool | None  # None: not known (a digest missing, or nothing to tell them apart by)
    text: str  # the line compare prints after "dataset: "


def digest_of(index: dict) -> dict | None:
    digest = index.get(RECORD_DATASET)
    return digest if isinstance(digest, dict) else None


def describe(digest: dict | None) -> str:
    """One run's dataset in one line."""
    if digest is None:
        return NOT_RECORDED
    parts = [str(digest.get("path", "?"))]
    if digest.get("sha256"):
        parts.append(f"index sha256 {digest['sha256'][:12]}, {digest.get('rows')} rows")
    if digest.get("files"):
        parts.append(f"tensor files sha256 {str(digest.get('files_sha256'))[:12]} "
                     f"({digest.get('files_hashed')} of {digest['files']} files)")
    if digest.get("problem"):
        parts.append(str(digest["problem"]))
    return ", ".join(parts)


def _difference(a: dict, b: dict) -> str | None:
    """How two digests say the data differ, or None."""
    if a["sha256"] != b["sha256"]:
        rows = f" ({a.get('rows')} vs {b.get('rows')} rows)" if a.get("rows") != b.get("rows") else \
            f" ({a.get('rows')} rows each, other entries or another order)"  # fmt: skip
        return f"their index files differ{rows}"
    if a.get("files_hashed") == b.get("files_hashed") and a.get("files_sha256") != b.get("files_sha256"):
        return "the same index, but the tensor files it names differ (embeddings made by another model or device)"
    return None


def compare_datasets(index_a: dict, index_b: dict) -> Datasets:
    a, b = digest_of(index_a), digest_of(index_b)
    if a is None or b is None or not a.get("sha256") or not b.get("sha256"):
        which = " and ".join(role for role, d in (("RUN_A", a), ("RUN_B", b)) if d is None or not d.get("sha256"))
        return Datasets(a, b, None, f"unknown whether the runs read the same data: {which} recorded no readable "
                                    "dataset digest")  # fmt: skip
    why = _difference(a, b)
    if why:
        return Datasets(a, b, False, f"DIFFERS: the runs read different datasets: {why}; with bit-equal noise a "
                                     "divergence from step 1's latents on is the data's, not the device's: compare "
                                     "runs that read the same dataset (copy RUN_A's)")  # fmt: skip
    partial = "" if a.get("files_hashed") == a.get("files") == b.get("files_hashed") else \
        " (tensor files compared as far as both digests read them)"  # fmt: skip
    return Datasets(a, b, True, f"the same in both runs{partial}")
