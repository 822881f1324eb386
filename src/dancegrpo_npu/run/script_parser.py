"""A script's arguments checked by the script's own argparse parser, before anything starts.

Upstream's trainers and preprocessing scripts build their parser in ``if __name__ ==
"__main__":`` and parse ``sys.argv`` there, after every rank has loaded torch, diffusers and the
models: a flag the script lacks (``--use_ema`` in some) would stop every rank after start-up.
Here the statements of that block up to the ``parse_args`` call are taken from the script's
syntax tree (with the module-level imports and definitions they name, e.g. the port's
``hooks.add_arguments``) and run in a child process of the run's dependency set, which then
parses the launch's final arguments with that parser.

Abbreviations: argparse takes a unique prefix of a flag as the flag (``--max_train_step 10``
is ``--max_train_steps 10``), while every other part of launch (upstream's recipe overridden
flag by flag, the plan, resume's checks) reads flags by their full names, so a prefix is
refused, naming the flag it would be.  A script whose parser cannot be read this way (no such
block) is not checked, and the plan says so.
"""

from __future__ import annotations

import ast
import difflib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

# Runs in the child: builds the parser from the statements the parent extracted, parses.
_CHILD = r"""
import argparse, json, sys
request = json.load(sys.stdin)
sys.path.insert(0, request["tree"])
sys.argv = [request["script"]]

class Refused(Exception):
    pass

def error(self, message):
    raise Refused(message)

def exit(self, status=0, message=None):
    raise Refused(message or f"exit {status}")

argparse.ArgumentParser.error = error
argparse.ArgumentParser.exit = exit
namespace = {"__name__": "__dancegrpo_script_parser__", "__file__": request["script"]}
exec(compile(request["code"], request["script"], "exec"), namespace)
parser = namespace[request["parser"]]
options = sorted(s for s in parser._option_string_actions if s.startswith("--"))
answer = {"options": options, "error": None, "values": None}
parser.allow_abbrev = False  # prefixes are refused by the parent, naming the flag
try:
    answer["values"] = {k: v for k, v in vars(parser.parse_args(request["args"])).items()}
except Refused as e:
    answer["error"] = str(e)
if request["probe"]:  # the job's devices, for the run's record (host.devices); a trainer's parser imported torch already
    probe = {}
    exec(request["probe"], probe)
    answer["devices"] = {**probe["devices"](), "probed_with": "the check of the script's arguments"}
print(json.dumps(answer, default=str))
"""


@dataclass(frozen=True)
class ParserCode:
    """The source that builds a script's parser, and the name it is bound to."""

    code: str
    parser: str


def _main_block(tree: ast.Module) -> ast.If | None:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [ast.unparse(node.test.left), *(ast.unparse(c) for c in node.test.comparators)]
            if "__name__" in names and any("__main__" in n for n in names):
                return node
    return None


def _parse_call(node: ast.stmt) -> str | None:
    """The parser's name when ``node`` calls ``<parser>.parse_args`` / ``parse_known_args``."""
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("parse_args", "parse_known_args") and isinstance(sub.func.value, ast.Name)):
            return sub.func.value.id
    return None


def _bound(node: ast.stmt) -> set[str]:
    """The names a module-level statement binds."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def parser_code(script: Path) -> ParserCode | None:
    """The code that builds ``script``'s parser: the main block's statements before its
    ``parse_args``, after the module-level statements binding the names they use.  None when
    the script has no such block."""
    try:
        module = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError, ValueError):
        return None
    block = _main_block(module)
    if block is None:
        return None
    body, parser = [], None
    for stmt in block.body:
        parser = _parse_call(stmt)
        if parser is not None:
            break
        body.append(stmt)
    if parser is None:
        return None
    used = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    needed: list[ast.stmt] = []
    for _ in range(3):  # definitions may name others (a type= function using a constant)
        for node in module.body:
            if node not in needed and _bound(node) & used:
                needed.append(node)
                used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    needed.sort(key=lambda n: n.lineno)
    code = "\n".join(ast.unparse(n) for n in (*needed, *body))
    return ParserCode(code, parser)


@dataclass(frozen=True)
class Parsed:
    options: tuple[str, ...]  # the script's --flags
    error: str | None  # argparse's message for the arguments, None when they parse
    values: dict | None  # the namespace the script would get
    devices: dict | None = None  # host.devices' probe in the same child, when asked for


def run_parser(script: Path, tree: Path, python: str, args: list[str], code: ParserCode,
               env: dict[str, str] | None = None) -> Parsed:
    """``args`` parsed by ``script``'s parser, in ``python`` (a child process).  ``env``: the job's
    environment, which the child then runs with, and probes the job's devices in as well."""
    from dancegrpo_npu.host.devices import DEVICE_PROBE_FUNCTION

    request = {"tree": str(tree), "script": str(script), "code": code.code, "parser": code.parser, "args": list(args),
               "probe": DEVICE_PROBE_FUNCTION if env is not None else None}
    try:
        proc = subprocess.run([python, "-c", _CHILD], input=json.dumps(request), capture_output=True, text=True,
                              timeout=300, cwd=tree, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _unreadable(script, f"{python}: {e}") from None
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise _unreadable(script, lines[-1] if lines else f"exit {proc.returncode}")
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    return Parsed(tuple(answer["options"]), answer["error"], answer["values"], answer.get("devices"))


def _unreadable(script: Path, why: str) -> DancegrpoError:
    return DancegrpoError(f"the arguments of {script.name} could not be checked by its parser: {why}",
                          "check the patched tree (`dancegrpo-npu verify`) and the dependency set "
                          "(`dancegrpo-npu doctor`)")


def flag_problem(script: str, flag: str, options: tuple[str, ...], typed: bool) -> str | None:
    """One line when ``flag`` is not one of ``options`` (exactly): a prefix of one, or none."""
    if flag in options:
        return None
    where = " after --" if typed else ""
    prefixed = [o for o in options if o.startswith(flag)]
    if len(prefixed) == 1:
        return (f"{flag}{where} is an abbreviation of {script}'s {prefixed[0]}, which its parser would take "
                f"for it; write {prefixed[0]} in full")
    if prefixed:
        return f"{flag}{where} is not a flag of {script}; it starts {', '.join(prefixed[:4])}"
    close = difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
    return (f"{flag}{where} is not a flag of {script}, which would stop at start-up on every rank "
            "(unrecognized arguments)" + (f"; did you mean {close[0]}?" if close else ""))


def check_script_args(script: Path, tree: Path, python: str, script_args: list[str],
                      user_flags: set[str], env: dict[str, str] | None = None) -> Parsed | None:
    """Refuse, in one line naming the flag (exit 2), arguments ``script``'s parser would refuse
    or read as another flag; the parsed values, or None when the parser cannot be read.
    ``env``: the job's environment (run_parser)."""
    from dancegrpo_npu.run.upstream_args import split_flags

    code = parser_code(script)
    if code is None:
        return None
    parsed = run_parser(script, tree, python, script_args, code, env)
    for flag, _, _ in split_flags(script_args):
        if flag in ("--help",):
            raise DancegrpoError(f"--help is not an argument to launch {script.name} with",
                                 f"read its flags with `python {script.name} --help` in the patched tree", exit_code=2)
        problem = flag_problem(script.name, flag, parsed.options, flag in user_flags)
        if problem:
            raise DancegrpoError(problem, "fix the script's arguments; nothing was started", exit_code=2)
    if parsed.error:
        raise DancegrpoError(f"{script.name} would refuse its arguments: {parsed.error}",
                             "fix the script's arguments; nothing was started", exit_code=2)
    return parsed
