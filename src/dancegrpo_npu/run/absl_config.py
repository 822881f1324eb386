"""An absl / ml_collections configuration (a trainer's ``--config FILE:NAME`` and its
``--config.KEY=VALUE`` overrides) read before anything starts, the way the trainer reads it.

The trainer defines the flag at import (``config_flags.DEFINE_config_file("config", ...)``) and
absl parses it in ``app.run``, after torchrun has started every rank: a configuration name the
file lacks, a key it lacks or a value of the wrong type stops each rank then.  Here the script's
own ``DEFINE_config_file`` statement is taken from its syntax tree and run in a child process of
the run's dependency set, with the patched tree on ``sys.path``; absl then parses the launch's
``--config...`` arguments with it (ml_collections' own override parsing, so a value is typed as
the trainer's absl types it), and the row's ``config_check`` (the overlay's check of the port's
flags against the configuration, ``module:function`` in the patched tree) reads the result with
the values the script's argparse parser gave the port's flags.  A problem is one line naming the
key or flag, exit 2.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

_CHILD = r"""
import argparse, difflib, importlib, importlib.util, inspect, json, os, sys
request = json.load(sys.stdin)
sys.path.insert(0, request["tree"])
sys.argv = [request["script"], *request["argv"]]  # what the trainer's import sees
answer = {"error": None, "hint": None, "problem": None}
shown = request["shown"]


def done():
    print(json.dumps(answer))
    sys.exit(0)


def refuse(error, hint):
    answer["error"], answer["hint"] = error, hint
    done()


def load_base():
    # the configuration without the overrides, as ml_collections loads it: the file, get_config(NAME)
    from ml_collections import ConfigDict

    value = request["config"]
    if value is None:
        return None
    path, _, name = value.partition(":")
    if not os.path.isfile(path):
        refuse(f"--config {shown}: {path} does not exist", "give an existing configuration file, e.g. "
               + request["example"])
    spec = importlib.util.spec_from_file_location("dancegrpo_absl_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if name:
        try:
            return module.get_config(name)
        except (KeyError, AttributeError, TypeError):
            names = sorted(n for n, f in vars(module).items()
                           if inspect.isfunction(f) and f.__module__ == module.__name__ and not n.startswith("_")
                           and n != "get_config" and f.__code__.co_argcount == 0)
            close = difflib.get_close_matches(name, names, n=1)
            refuse(f"--config {shown}: {os.path.basename(path)} has no configuration {name!r}",
                   (f"did you mean {close[0]}? " if close else "") + f"choose one of: {', '.join(names)}")
    return module.get_config()


def kind(value):
    return type(value).__name__


def diagnose(flag_name, exc):
    # which override the trainer's absl would stop at, named with the key and what it takes
    from ml_collections import ConfigDict

    base = load_base()
    where = shown.rsplit("/", 1)[-1]
    if base is not None:
        for word in request["overrides"]:
            key, _, value = word[len(flag_name) + 3:].partition("=")
            node, walked = base, []
            for part in key.split("."):
                if isinstance(node, ConfigDict) and part in node:
                    node, walked = node[part], walked + [part]
                    continue
                keys = sorted(node.keys()) if isinstance(node, ConfigDict) else []
                inside = ".".join(walked)
                close = difflib.get_close_matches(part, keys, n=1)
                hint = (f"did you mean --{flag_name}.{inside + '.' if inside else ''}{close[0]}? " if close else "")
                listed = f"its {inside or 'top-level'} keys: {', '.join(keys)}" if keys else \
                    f"{inside} is a {kind(node)}, not a group of keys"
                refuse(f"{word}: the configuration {where} has no key {key} ({listed})",
                       hint + "fix the override after --; nothing was started")
    text = " ".join(str(exc).split())
    if request["config"] is None and "config" in text.lower():
        refuse(f"no --config: {request['script_name']}'s default configuration cannot be loaded ({text})",
               "give one, e.g. " + request["example"])
    refuse(f"{request['script_name']} would refuse its configuration: {type(exc).__name__}: {text}",
           "fix the --config arguments after --; nothing was started")


try:
    from absl import flags
except ImportError as e:
    print(f"absl is not installed: {e}", file=sys.stderr)
    sys.exit(3)
namespace = {"__name__": "__dancegrpo_absl_config__", "__file__": request["script"]}
flag_name = request["flag"]
try:
    exec(compile(request["code"], request["script"], "exec"), namespace)
    flags.FLAGS([request["script"], *request["absl_argv"]])
    config = flags.FLAGS[flag_name].value
    _ = config.keys()  # a configuration that failed to load says so when it is read
except flags.IllegalFlagValueError as e:
    text = " ".join(str(e).split())
    word = next((w for w in request["overrides"] if text.startswith(f"flag {w.split('=')[0]}=")), None)
    what = ""
    if word is not None:
        try:
            base = load_base()
            node = base
            for part in word[len(flag_name) + 3:].split("=")[0].split("."):
                node = node[part]
            shown_value = f" ({node!r})" if isinstance(node, (bool, int, float, str)) else ""
            what = f"; the configuration's {word.split('=')[0][2:]} is a {kind(node)}{shown_value}"
        except Exception:  # noqa: BLE001 - the message stands without it
            pass
    refuse(f"{text.removeprefix('flag ')}{what}", "fix the override after --; nothing was started")
except flags.Error as e:
    refuse(f"{request['script_name']}'s absl would refuse its flags: {' '.join(str(e).split())}",
           "fix the --config arguments after --; nothing was started")
except SystemExit:
    raise
except Exception as e:  # noqa: BLE001 - an unknown key, a configuration name, a file: named below
    diagnose(flag_name, e)
if request["check"]:
    module, _, function = request["check"].partition(":")
    args = argparse.Namespace(**request["values"])
    answer["problem"] = getattr(importlib.import_module(module), function)(args, config)
if request["settle"] and not answer["problem"]:
    # the port's flags as the trainer's main leaves them: a flag not given takes its configuration's value
    module, _, function = request["settle"].partition(":")
    args = argparse.Namespace(**request["values"])
    getattr(importlib.import_module(module), function)(args, config)
    answer["settled"] = {k: v for k, v in vars(args).items() if v is None or isinstance(v, (bool, int, float, str))}
done()
"""


def config_flag_code(script: Path) -> tuple[str, str] | None:
    """The statements of ``script`` that define its absl configuration flag (its module-level
    ``DEFINE_config_file`` call, after the imports and assignments it names), and the flag's
    name; None when it defines none."""
    from dancegrpo_npu.run.script_parser import _bound

    try:
        module = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError, ValueError):
        return None
    defines, name = [], None
    for node in module.body:
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                    and sub.func.attr == "DEFINE_config_file" and sub.args
                    and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str)):
                defines.append(node)
                name = name or sub.args[0].value
                break
    if not defines:
        return None
    used = {n.id for d in defines for n in ast.walk(d) if isinstance(n, ast.Name)}
    needed = [n for n in module.body if n not in defines and not isinstance(n, (ast.FunctionDef, ast.ClassDef))
              and _bound(n) & used]
    code = "\n".join(ast.unparse(n) for n in sorted((*needed, *defines), key=lambda n: n.lineno))
    return code, name


def check_config(script: Path, tree: Path, python: str, script_args: list[str], flags: tuple[str, ...],
                 values: dict | None, check: str, example: str, settle: str = "") -> dict | None:
    """Refuse, in one line (exit 2), a configuration ``script``'s absl would refuse, or one its
    ``check`` (the overlay's, given the port's parsed ``values``) finds it cannot run with; an
    error (exit 1) when the check cannot run.  Returns the port's values as ``settle`` (the
    overlay's, as the trainer's main calls it: a flag not given takes its configuration key's
    value) leaves them; None without ``settle``, or when the script defines no configuration flag."""
    from dancegrpo_npu.run.script_parser import _unreadable
    from dancegrpo_npu.run.upstream_args import join_flags, split_flags

    found = config_flag_code(script)
    if found is None:
        return None
    code, name = found
    flag = f"--{name}"
    if flag not in flags:
        return None
    items = split_flags(script_args)
    absl_items = [item for item in items if item[0] == flag or item[0].startswith(flag + ".")]
    given = [value for f, value, _ in absl_items if f == flag]
    config = given[-1] if given else None
    shown = config or ""
    if config:
        shown = f"{_shown_path(Path(config.partition(':')[0]), tree)}{''.join(config.partition(':')[1:])}"
    request = {
        "tree": str(tree), "script": str(script), "script_name": script.name, "argv": list(script_args),
        "code": code, "flag": name, "absl_argv": join_flags(absl_items), "config": config, "shown": shown,
        "overrides": [f"{f}={v}" if v is not None else f for f, v, _ in absl_items if f != flag],
        "values": values or {}, "check": check, "example": example, "settle": settle,
    }
    try:
        proc = subprocess.run([python, "-c", _CHILD], input=json.dumps(request, default=str), capture_output=True,
                              text=True, timeout=300, cwd=tree)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _unreadable(script, f"{python}: {e}") from None
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise _unreadable(script, lines[-1] if lines else f"exit {proc.returncode}") from None
    if answer["error"]:
        raise DancegrpoError(answer["error"], answer["hint"], exit_code=2)
    if answer["problem"]:
        raise DancegrpoError(f"{script.name} would refuse its arguments: {answer['problem']}",
                             "fix the script's arguments; nothing was started", exit_code=2)
    return answer.get("settled")


def _shown_path(path: Path, tree: Path) -> str:
    """A configuration file as the user reads it: relative to the patched tree when it is there."""
    try:
        return str(path.relative_to(tree))
    except ValueError:
        return str(path)
