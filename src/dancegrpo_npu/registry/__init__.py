"""The trainer registry: every script ``launch`` runs, one row each (``spec.TrainerSpec``).

Launch, smoke, bench, plan, doctor and runs read its rows, and every ``--help`` lists them from
here.  The rows are the families': one folder a family of models (``dancegrpo_npu.trainers.<family>``)
holds its rows and everything the tool knows of it, and this package finds the folders by walking
``dancegrpo_npu.trainers`` when it is first imported, never by an import written here.  So the
machinery below the families (engine, run, smoke, ...) reads the registry without importing a
family, and a family may use that machinery: the packages import each other without a cycle.
Adding a trainer is adding a folder or a row (and, in the patch series, its seam patch and model
fixes): docs/architecture.md.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.registry.spec import Bench, BenchPreset, ImageSizes, Input, Smoke, TrainerSpec

__all__ = ["REGISTRY", "Bench", "BenchPreset", "ImageSizes", "Input", "Smoke", "TrainerSpec", "aligning", "benched",
           "default_trainer", "families", "get", "load", "names", "planned", "preprocessing", "run_name", "smoke_spec", "smoked",
           "trainers", "unknown"]


# the package whose subpackages are the families
FAMILIES_PACKAGE = "dancegrpo_npu.trainers"


def _families() -> list:
    """Every family folder of ``dancegrpo_npu.trainers`` (a subpackage with ``ROWS``), in their
    ``ORDER`` (then by name): a folder copied there under a new name is a new family, with no list
    to edit."""
    package = importlib.import_module(FAMILIES_PACKAGE)
    found = [importlib.import_module(f"{FAMILIES_PACKAGE}.{info.name}") for info in pkgutil.iter_modules(package.__path__)
             if info.ispkg]
    families = [module for module in found if hasattr(module, "ROWS")]
    return sorted(families, key=lambda module: (getattr(module, "ORDER", 100), module.__name__))


@functools.cache
def _walked() -> tuple[tuple, dict[str, TrainerSpec]]:
    """(the families, {row name: row}), made the first time a row is asked for, not when this
    package is imported: a family's own modules import ``registry.spec``, and one of them imported
    first must not set the walk off half-way through its own import."""
    families = tuple(_families())
    return families, rows_of(families)


def rows_of(families) -> dict[str, TrainerSpec]:
    """{row name: row} of ``families``' ``ROWS``, in their order; a name given twice is refused."""
    rows: dict[str, TrainerSpec] = {}
    for family in families:
        for spec in family.ROWS:
            if spec.name in rows:
                raise DancegrpoError(f"two trainer rows are named {spec.name!r} ({family.__name__} and another family)",
                                     "give each row of a family folder copied under a new name a name of its own")
            rows[spec.name] = spec
    return rows


def __getattr__(name: str):
    """``REGISTRY`` ({row name: row}, in the families' order) and ``FAMILIES`` (their modules),
    walked when first read."""
    if name == "REGISTRY":
        return _walked()[1]
    if name == "FAMILIES":
        return _walked()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rows() -> dict[str, TrainerSpec]:
    return _walked()[1]


def names() -> list[str]:
    """Every script launch runs, trainers and preprocessing, in the registry's order."""
    return list(_rows())


def unknown(name: str, what: str, choices: list[str], verb: str = "") -> DancegrpoError:
    """The one-line refusal of a name that is not among ``choices``, with the nearest one."""
    import difflib

    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    meant = f"did you mean {close[0]}? " if close else ""
    return DancegrpoError(f"{verb + ': ' if verb else ''}unknown {what} {name!r}",
                          f"{meant}choose one of: {', '.join(choices)}", exit_code=2)


def get(name: str, what: str = "script") -> TrainerSpec:
    """The row named ``name``; an unknown name is refused in one line (exit 2)."""
    try:
        return _rows()[name]
    except KeyError:
        raise unknown(name, what, names()) from None


def trainers() -> list[str]:
    """The GRPO trainers (their outputs are the run's own), not the preprocessing scripts."""
    return [name for name, spec in _rows().items() if spec.is_trainer]


def preprocessing() -> list[str]:
    return [name for name, spec in _rows().items() if not spec.is_trainer]


def families() -> dict[str, list[str]]:
    """{family folder name: the names of its trainers}, in the registry's order (what a test
    belongs to when it names a family or one of its trainers: scripts/test_cost.py)."""
    return {module.__name__.rsplit(".", 1)[-1]: [spec.name for spec in module.ROWS if spec.is_trainer]
            for module in _walked()[0]}


def default_trainer() -> TrainerSpec:
    """The trainer smoke runs when none is named (the row with ``default=True``)."""
    return next(spec for spec in _rows().values() if spec.default)


def aligning() -> list[str]:
    """The trainers whose seam has the alignment and --profile features."""
    return [name for name, spec in _rows().items() if spec.aligns]


def smoked() -> list[str]:
    """The trainers ``smoke`` runs."""
    return [name for name, spec in _rows().items() if spec.smoke is not None]


def smoke_spec(name: str) -> TrainerSpec:
    spec = _rows().get(name)
    if spec is None or spec.smoke is None:
        raise unknown(name, "trainer", smoked())
    return spec


def benched() -> list[TrainerSpec]:
    """The trainers ``bench`` has presets for."""
    return [spec for spec in _rows().values() if spec.bench is not None]


def planned() -> list[TrainerSpec]:
    """The trainers ``plan`` has model shapes for."""
    return [spec for spec in _rows().values() if spec.plan is not None]


def run_name(spec: TrainerSpec) -> str:
    """The smoke run's directory suffix."""
    return spec.smoke.run_name or f"smoke-{spec.name}"


def load(ref: str):
    """The object a row names as ``"module:attr"`` (imported when used, so that this package
    imports none of the packages that read it)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
