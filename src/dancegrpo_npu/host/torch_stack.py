"""Which torch / torchvision / torch_npu a host gets, chosen from Ascend's compatibility table.

The table is data (``torch_stack.json`` beside this file, with its source and the day it was
read).  ``scripts/bootstrap.sh`` runs this module by path, before anything is installed
(``python src/dancegrpo_npu/host/torch_stack.py choose [--torch 2.7]``), so it imports
nothing but the standard library and the tool's error type; ``doctor`` imports it to check an
installed stack against the same rows.

On an Ascend host the choice follows the host's CANN, read from the toolkit's own version file
``<root>/<arch>-linux/ascend_toolkit_install.info`` (``version=``):

- the root is ``ASCEND_HOME_PATH`` (or ``ASCEND_TOOLKIT_HOME``) when it is set (CANN's
  ``set_env.sh`` sets both: that is the CANN this shell uses), else the install roots under each base directory
  (``DANCEGRPO_ASCEND_BASES``, default ``/usr/local/Ascend:/usr/local/npu``):
  ``ascend-toolkit/latest`` (CANN 8.3 and older), ``cann`` and ``cann-<version>`` (CANN 8.5 and
  newer);
- a torch line (``2.10`` by default; ``2.7`` is MindSpeed-MM's) picks, among the rows that list
  this CANN (newest release first), the newest wheel of that line; where no row of the CANN
  lists a 2.10 wheel, the default is the newest wheel of its newest row;
- torch is the version the wheel is built for, and its CPU build (torch_npu refuses a torch
  that brings CUDA); torchvision is the one built with that torch.

A table of releases always trails the next release, so a CANN that no row lists is not refused
when it is newer than the table's newest row, or inside the CANN range Ascend declares its
releases compatible with (``declared_compatibility``): it takes the row of the newest CANN older
than it, with one warning line (the table's date, the row used, whether the CANN is inside the
declared range, how to force another pair).  A CANN older than every row that lists a supported
line (torch 2.7.1 and later) is refused, so is a forced pair that no row used for the host's CANN
lists (unless ``DANCEGRPO_TORCH_UNCHECKED=1``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run by path from bootstrap.sh: the tool's package is not installed yet
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dancegrpo_npu.errors import DancegrpoError  # noqa: E402  (stdlib only, like this module)

TABLE_FILE = Path(__file__).with_name("torch_stack.json")
BASES_ENV = "DANCEGRPO_ASCEND_BASES"
DEFAULT_BASES = ("/usr/local/Ascend", "/usr/local/npu")
INFO_FILE = "ascend_toolkit_install.info"
UNCHECKED_ENV = "DANCEGRPO_TORCH_UNCHECKED"


@dataclass(frozen=True)
class Row:
    release: str  # TorchNPU release
    cann: str  # "9.1.0", or "9.1.x" for every 9.1 release
    wheels: tuple[str, ...]  # torch_npu versions, newest first
    source: str = ""  # where the row was read
    read: str = ""  # the day it was read


@dataclass(frozen=True)
class Declared:
    """The CANN versions Ascend declares a span of its releases compatible with."""
    releases: str  # "26.0.x-26.2.x"
    cann_from: str  # "8.5": the oldest CANN of the range, every patch release of it included
    cann_to: str  # "9.2"
    source: str

    def covers(self, version: str) -> bool:
        return cann_key(self.cann_from)[:2] <= cann_key(version)[:2] <= cann_key(self.cann_to)[:2]


@dataclass(frozen=True)
class Line:
    name: str  # "2.10"
    torch: str
    torchvision: str
    who: str


@dataclass(frozen=True)
class Table:
    rows: tuple[Row, ...]  # newest release first
    lines: dict[str, Line]
    default_line: str
    cpu_index: str
    off_ascend: dict[str, Line]
    source: str
    read: str  # the newest day a row was read: the table's date
    declared: Declared | None = None

    def line_of(self, wheel: str) -> Line | None:
        return next((line for line in self.lines.values() if line.torch == base_version(wheel)), None)


@dataclass(frozen=True)
class Cann:
    version: str
    info_file: Path


@dataclass(frozen=True)
class Choice:
    torch: str
    torchvision: str
    torch_npu: str | None  # None off Ascend
    why: str
    warning: str | None = None
    index: str | None = None  # the index torch and torchvision come from (their CPU build), on Ascend

    def spec(self) -> str:
        npu = f" torch-npu=={self.torch_npu}" if self.torch_npu else ""
        return f"torch=={self.torch} torchvision=={self.torchvision}{npu}"


def load_table(path: Path = TABLE_FILE) -> Table:
    data = json.loads(path.read_text())
    lines = {name: Line(name=name, **fields) for name, fields in data["lines"].items()}
    off = {arch: Line(name=arch, who="", **fields) for arch, fields in data["off_ascend"].items()}
    rows = tuple(Row(release=r["release"], cann=r["cann"], wheels=tuple(r["wheels"]), source=r["source"],
                     read=r["read"]) for r in data["rows"])
    declared = data.get("declared_compatibility")
    return Table(rows=rows, lines=lines, default_line=data["default_line"], cpu_index=data["cpu_index"],
                 off_ascend=off, source=data["source"], read=max(r.read for r in rows),
                 declared=Declared(releases=declared["releases"], cann_from=declared["cann_from"],
                                   cann_to=declared["cann_to"], source=declared["source"]) if declared else None)


def base_version(version: str) -> str:
    """'2.7.1+cpu' -> '2.7.1'; '2.7.1.post2' -> '2.7.1'; '2.7.1rc1' -> '2.7.1'."""
    m = re.match(r"(\d+\.\d+\.\d+)", version)
    return m.group(1) if m else version


def cann_matches(row_cann: str, version: str) -> bool:
    """Whether a row's CANN ("9.1.0", "9.1.x", "8.3.RC1") covers the host's version."""
    row, host = row_cann.lower(), version.strip().lower()
    if row.endswith(".x"):
        return host.startswith(row[:-1])
    return host == row or host.startswith(row + ".")


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def cann_key(version: str) -> tuple[int, int, int, int]:
    """A CANN version's order: '8.3.RC1' < '8.3.0' < '9.1.1' < '9.1.x' (every 9.1) < '9.2.0'."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\w+))?", version.strip())
    if not m:
        return (0, 0, 0, 0)
    patch = (m.group(3) or "0").lower()
    if patch == "x":
        return (int(m.group(1)), int(m.group(2)), 1 << 20, 0)
    rc = re.fullmatch(r"rc(\d+)", patch)
    if rc:
        return (int(m.group(1)), int(m.group(2)), -1, int(rc.group(1)))
    digits = re.match(r"\d+", patch)
    return (int(m.group(1)), int(m.group(2)), int(digits.group(0)) if digits else 0, 0)


# ---------------------------------------------------------------- where CANN is


def bases(environ) -> list[Path]:
    value = environ.get(BASES_ENV)
    return [Path(p) for p in (value.split(os.pathsep) if value else DEFAULT_BASES) if p]


def active_home(environ) -> str | None:
    """The CANN that ``set_env.sh`` put in this environment, if any."""
    return environ.get("ASCEND_HOME_PATH") or environ.get("ASCEND_TOOLKIT_HOME") or None


def install_roots(environ) -> list[Path]:
    """The CANN roots to read, in order: the active one alone when set, else every install root
    under the bases (``cann-<version>`` newest first)."""
    home = active_home(environ)
    if home:
        return [Path(home)]
    roots: list[Path] = []
    for base in bases(environ):
        versioned = sorted(base.glob("cann-*"), key=lambda p: _version_key(p.name[5:]), reverse=True)
        roots += [base / "cann", *versioned, base / "ascend-toolkit" / "latest"]
    return roots


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.\-]", version))


def read_key(path: Path, key: str) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower():
            return value.strip().strip('"') or None
    return None


def version_in(root: Path) -> Cann | None:
    """The CANN version of one install root: ``<root>/<arch>-linux/ascend_toolkit_install.info``."""
    candidates = [root / f"{platform.machine()}-linux" / INFO_FILE, *sorted(root.glob(f"*-linux/{INFO_FILE}"))]
    for path in candidates:
        version = read_key(path, "version")
        if version:
            return Cann(version=version, info_file=path)
    return None


def find_cann(environ) -> Cann | None:
    for root in install_roots(environ):
        found = version_in(root)
        if found:
            return found
    return None


def set_env_scripts(environ) -> list[Path]:
    """Every CANN ``set_env.sh`` on this host: the active root's first, then the install roots'."""
    places: list[Path] = []
    home = active_home(environ)
    if home:
        places += [Path(home) / "set_env.sh", Path(home).parent / "set_env.sh"]
    for base in bases(environ):
        places += [base / "cann" / "set_env.sh", *sorted(base.glob("cann-*/set_env.sh"), reverse=True),
                   base / "ascend-toolkit" / "set_env.sh"]
    return list(dict.fromkeys(p for p in places if p.is_file()))


def is_ascend_host(environ) -> bool:
    """An Ascend host: CANN in the environment, an install base directory, or ``npu-smi``."""
    return bool(active_home(environ)) or any(b.is_dir() for b in bases(environ)) or bool(
        shutil.which("npu-smi", path=environ.get("PATH")))


# ---------------------------------------------------------------- the choice


def rows_for(table: Table, version: str) -> list[Row]:
    return [row for row in table.rows if cann_matches(row.cann, version)]


def _supported(table: Table, row: Row) -> list[str]:
    return [w for w in row.wheels if table.line_of(w)]


def _rows_text(table: Table, rows: list[Row]) -> str:
    return "; ".join(f"CANN {r.cann} (TorchNPU {r.release}): {', '.join(r.wheels)}" for r in rows)


def usable_rows(table: Table, cann: Cann) -> list[Row]:
    """The rows used for this CANN: those that list it with a wheel of a supported line, or for a
    CANN no row lists, the row of the newest older CANN (see :func:`untabled_warning`); refuses a
    CANN without one."""
    return _resolve(table, cann)[0]


def untabled_warning(table: Table, cann: Cann) -> str | None:
    """The one warning line for a CANN that no row lists but that gets a row all the same, else None."""
    return _resolve(table, cann)[1]


def _resolve(table: Table, cann: Cann) -> tuple[list[Row], str | None]:
    rows = rows_for(table, cann.version)
    usable = [r for r in rows if _supported(table, r)]
    if usable:
        return usable, None
    working = [r for r in table.rows if _supported(table, r)]
    if not rows:
        host = cann_key(cann.version)
        older = [r for r in working if cann_key(r.cann) < host]
        newer_than_table = host > max(cann_key(r.cann) for r in table.rows)
        inside = table.declared is not None and table.declared.covers(cann.version)
        if older and (newer_than_table or inside):
            return [older[0]], _warning(table, cann, older[0], newer_than_table, inside)
    oldest = working[-1].cann
    lines = ", ".join(f"torch {line.torch}" for line in sorted(table.lines.values(), key=lambda l: _version_key(l.torch)))
    if rows:
        listed = f"Ascend's table lists only {', '.join(w for r in rows for w in r.wheels)} for it"
    elif _major_minor(cann.version) < _major_minor(oldest):
        listed = "Ascend's table lists no torch_npu for it"
    else:
        raise DancegrpoError(
            f"CANN {cann.version} ({cann.info_file}) is not in Ascend's table as read on {table.read} "
            f"(rows: {', '.join(r.cann for r in table.rows)})",
            f"force a pair its release notes name: DANCEGRPO_TORCH='torch==X torchvision==Y torch-npu==Z' "
            f"with {UNCHECKED_ENV}=1", exit_code=2)
    raise DancegrpoError(
        f"CANN {cann.version} ({cann.info_file}): {listed}, no wheel of a line the port supports ({lines})",
        f"upgrade CANN to {oldest} or later (rows that list one: CANN {', '.join(r.cann for r in working)})",
        exit_code=2)


def _warning(table: Table, cann: Cann, row: Row, newer_than_table: bool, inside: bool) -> str:
    where = ("newer than Ascend's table" if newer_than_table else "not in Ascend's table")
    declared = table.declared
    if declared is None:
        range_text = "Ascend declares no CANN range for its releases in the table"
    else:
        span = f"{declared.cann_from}.x-{declared.cann_to}.x"
        range_text = (f"it is {'inside' if inside else 'outside'} the CANN range Ascend declares for TorchNPU "
                      f"{declared.releases} ({span})")
        if not inside:
            range_text += ", so look for a newer TorchNPU release"
    return (f"CANN {cann.version} is {where} as read on {table.read}: using the row of the newest older CANN, "
            f"TorchNPU {row.release} (CANN {row.cann}); {range_text}; to install another pair set "
            f"DANCEGRPO_TORCH='torch==X torchvision==Y torch-npu==Z' with {UNCHECKED_ENV}=1")


def choose_line(table: Table, cann: Cann, line: str | None) -> Choice:
    """The pair of ``line`` (default: the table's) for this CANN."""
    rows = usable_rows(table, cann)
    asked = line is not None
    name = line or table.default_line
    if name not in table.lines:
        raise DancegrpoError(f"--torch {name}: not a torch line the port supports",
                             f"choose one of {', '.join(table.lines)}", exit_code=2)
    wanted = table.lines[name]
    for row in rows:
        wheel = next((w for w in row.wheels if base_version(w) == wanted.torch), None)
        if wheel:
            return _choice(table, cann, row, wheel, wanted)
    if asked:
        having = [r for r in table.rows if any(base_version(w) == wanted.torch for w in r.wheels)]
        raise DancegrpoError(
            f"--torch {name}: no row of CANN {cann.version} lists a torch_npu {wanted.torch}",
            f"leave --torch out for this CANN's newest wheel, or use a CANN whose row does: "
            f"{', '.join(r.cann for r in having)}", exit_code=2)
    row = rows[0]
    wheel = _supported(table, row)[0]  # the newest wheel of the newest row
    return _choice(table, cann, row, wheel, table.line_of(wheel),
                   note=f"this CANN's rows list no torch {wanted.torch} wheel")


def _choice(table: Table, cann: Cann, row: Row, wheel: str, line: Line, note: str = "") -> Choice:
    reasons = "; ".join(r for r in (note, line.who) if r)
    why = (f"CANN {cann.version} (from {cann.info_file}) is the TorchNPU {row.release} row (CANN {row.cann}) of "
           f"Ascend's table read {table.read}; torch {line.name} line ({reasons}): "
           f"torch_npu {wheel}, torch {line.torch} (CPU build), torchvision {line.torchvision}")
    return Choice(torch=line.torch, torchvision=line.torchvision, torch_npu=wheel, why=why, index=table.cpu_index,
                  warning=untabled_warning(table, cann))


def parse_spec(spec: str) -> dict[str, str]:
    """'torch==X torchvision==Y torch-npu==Z' -> {"torch": X, ...}; one-line refusal otherwise."""
    out: dict[str, str] = {}
    for part in spec.split():
        name, sep, version = part.partition("==")
        name = name.strip().lower().replace("_", "-")
        if not sep or not version or name not in ("torch", "torchvision", "torch-npu"):
            raise DancegrpoError(
                f"DANCEGRPO_TORCH={spec!r}: {part!r} is not torch==X, torchvision==Y or torch-npu==Z",
                "give a torch line (e.g. 2.7) or exact pins: 'torch==2.10.0 torchvision==0.25.0 torch-npu==2.10.0.post6'",
                exit_code=2)
        out[name] = version
    if "torch" not in out or "torchvision" not in out:
        raise DancegrpoError(f"DANCEGRPO_TORCH={spec!r} names no torch or no torchvision",
                             "pin both, built for each other: 'torch==X torchvision==Y [torch-npu==Z]'", exit_code=2)
    return out


def pair_problem(table: Table, cann: Cann, torch: str, npu_version: str | None) -> str | None:
    """Why this torch / torch_npu does not go with this CANN by the table, or None."""
    if npu_version is None:
        return "no torch_npu is named"
    wheel = npu_version.split("+")[0]
    if base_version(torch) != base_version(wheel):
        return f"torch_npu {wheel} is built for torch {base_version(wheel)}, not torch {torch}"
    rows = rows_for(table, cann.version)
    if not rows:
        try:
            rows = usable_rows(table, cann)  # the row an untabled CANN gets
        except DancegrpoError:
            rows = []
    if not any(wheel in r.wheels for r in rows):
        listed = _rows_text(table, rows) if rows else "none"
        return f"Ascend's table does not list torch_npu {wheel} for CANN {cann.version} (its rows: {listed})"
    return None


def choose_forced(table: Table, cann: Cann, spec: str, environ) -> Choice:
    pins = parse_spec(spec)
    problem = pair_problem(table, cann, pins["torch"], pins.get("torch-npu"))
    choice = Choice(torch=pins["torch"], torchvision=pins["torchvision"], torch_npu=pins.get("torch-npu"),
                    why=f"forced by DANCEGRPO_TORCH on CANN {cann.version} (from {cann.info_file})",
                    index=table.cpu_index)
    if problem is None:
        return Choice(**{**choice.__dict__, "warning": _quiet(lambda: untabled_warning(table, cann))})
    if environ.get(UNCHECKED_ENV, "").strip() in ("1", "true", "yes"):
        return Choice(**{**choice.__dict__, "warning": f"{problem}: installing it anyway ({UNCHECKED_ENV}=1); "
                                                      "torch_npu may fail at import"})
    good = [f"torch=={table.line_of(w).torch} torch-npu=={w}" for r in usable_rows(table, cann) for w in _supported(table, r)]
    raise DancegrpoError(f"DANCEGRPO_TORCH={spec!r}: {problem}",
                         f"use a pair of this CANN's rows ({', '.join(dict.fromkeys(good))}), or set "
                         f"{UNCHECKED_ENV}=1 to install it anyway", exit_code=2)


def _quiet(warning) -> str | None:
    try:
        return warning()
    except DancegrpoError:  # a refused CANN: the pair was forced, the refusal is the table's, not the run's
        return None


def choose(environ, line: str | None = None, machine: str | None = None, table: Table | None = None) -> Choice:
    """What bootstrap installs on this host (``line``: ``--torch``; ``DANCEGRPO_TORCH`` a line or pins)."""
    table = table or load_table()
    forced = (environ.get("DANCEGRPO_TORCH") or "").strip()
    if line is None and forced and "==" not in forced:
        line = forced
        forced = ""
    if not is_ascend_host(environ):
        if forced:
            pins = parse_spec(forced)
            return Choice(torch=pins["torch"], torchvision=pins["torchvision"], torch_npu=pins.get("torch-npu"),
                          why="forced by DANCEGRPO_TORCH")
        if line is not None:
            if line not in table.lines:
                raise DancegrpoError(f"--torch {line}: not a torch line the port supports",
                                     f"choose one of {', '.join(table.lines)}", exit_code=2)
            chosen = table.lines[line]
            return Choice(torch=chosen.torch, torchvision=chosen.torchvision, torch_npu=None,
                          why=f"torch {line} line, asked for (no Ascend host: no torch_npu)")
        arch = machine or platform.machine()
        pinned = table.off_ascend.get(arch)
        if pinned is None:
            raise DancegrpoError(f"no torch pair is known for {arch}",
                                 "set DANCEGRPO_TORCH='torch==X torchvision==Y' (a pair built for each other)", exit_code=2)
        return Choice(torch=pinned.torch, torchvision=pinned.torchvision, torch_npu=None,
                      why=f"the {arch} default (no Ascend host)")
    cann = find_cann(environ)
    if cann is None:
        where = ", ".join(str(r) for r in install_roots(environ))
        raise DancegrpoError(
            f"this is an Ascend host, but no CANN version file (<root>/<arch>-linux/{INFO_FILE}) was found under {where}",
            "install the CANN toolkit, or source its set_env.sh (it sets ASCEND_HOME_PATH); the table is chosen by "
            f"CANN (elsewhere: {BASES_ENV}=DIR[:DIR])", exit_code=2)
    if forced:
        return choose_forced(table, cann, forced, environ)
    return choose_line(table, cann, line)


def main(argv: list[str] | None = None) -> int:
    """``choose [--torch LINE]``: key=value lines (ascend, spec, index, why, warning) for bootstrap.sh."""
    args = list(sys.argv[1:] if argv is None else argv)
    line = None
    if args[:1] != ["choose"]:
        print("usage: torch_stack.py choose [--torch LINE]", file=sys.stderr)
        return 2
    rest = args[1:]
    while rest:
        flag = rest.pop(0)
        if flag == "--torch" and rest:
            line = rest.pop(0)
        elif flag.startswith("--torch="):
            line = flag.split("=", 1)[1]
        else:
            print(f"torch_stack.py: unknown argument {flag}", file=sys.stderr)
            return 2
    environ = dict(os.environ)
    try:
        choice = choose(environ, line=line)
    except DancegrpoError as e:
        print(e.one_line(), file=sys.stderr)
        return e.exit_code
    print(f"ascend={int(is_ascend_host(environ))}")
    print(f"spec={choice.spec()}")
    print(f"index={choice.index or ''}")
    print(f"why={choice.why}")
    if choice.warning:
        print(f"warning={choice.warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
