"""The vocabulary shared with the patched tree, read from the overlay's own definition.

``overlay/dancegrpo_port/contract.py`` defines it once (phases, health keys, the records
format and replay fit, module groups, RNG choices, device kinds, the step-list syntax and its
parser).  The trainers import it inside the tree; the tool loads the same file from this
checkout's ``overlay/`` (stdlib only, so no torch is needed), and every tool module takes
those names from here: ``from dancegrpo_npu.contract import PHASES``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

CONTRACT_FILE = Path(__file__).resolve().parents[2] / "overlay" / "dancegrpo_port" / "contract.py"
_MODULE_NAME = "dancegrpo_npu._overlay_contract"


def _load():
    if _MODULE_NAME in sys.modules:
        return sys.modules[_MODULE_NAME]
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, CONTRACT_FILE)
    if spec is None or not CONTRACT_FILE.is_file():
        raise DancegrpoError(
            f"the shared vocabulary {CONTRACT_FILE} is missing",
            "run dancegrpo-npu from a complete checkout of the project (it reads overlay/ beside src/)",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


def __getattr__(name: str):
    try:
        return getattr(_load(), name)
    except AttributeError:
        raise AttributeError(f"the shared vocabulary ({CONTRACT_FILE.name}) defines no {name!r}") from None


# The step lists as the tool's messages and errors use them: the contract's one parser, with its
# refusal as the tool's one-line error.
def parse_step_spec(spec: str, what: str = "--record-steps") -> tuple[int, ...] | None:
    """A step list in the shared syntax (the trainers parse it the same way): ``"1-10,50"`` ->
    (1, ..., 10, 50); ``"all"`` -> None (every step).  Bad text is one line, exit 2."""
    try:
        steps = _load().parse_steps(spec, what)
    except ValueError as exc:
        raise DancegrpoError(str(exc), f"write {_load().STEPS_SYNTAX}, e.g. 1-10,50", exit_code=2) from None
    return None if steps is None else tuple(sorted(steps))


def shown_steps(steps) -> str:
    """A step list for messages: "1-3,7", or "none"."""
    return _load().format_steps(steps) or "none"
