"""The torch_npu the project talks to is the real one: the wheels bootstrap installs on CANN 9.1.x
and 9.2.0, read from their sources.

Read: 2.7.1.post10 and 2.10.0.post6 (CANN 9.1.x: MindSpeed-MM's 2.7 line and the default 2.10
line) and 2.7.1.post11 and 2.10.0.post7 (CANN 9.2.0, the newest row of Ascend's table, with
another ``is_available()`` rule).  Each wheel is downloaded with pip once and cached under
build/torch_npu-<version>-wheel (its Python sources, the entry points and the kernel schemas; no
shared library is unpacked).  Nothing of it is imported: the sources are read with ``ast`` and
as text.  Checked, for each wheel:

- every ``torch_npu.*`` and ``torch.npu.*`` name in src/, overlay/ and the patches' added lines
  (and the ``torch.npu`` functions the overlay reaches through ``getattr(torch, kind)``) exists
  in the wheel, with the signature the FAKE (tests/fakes/torch_npu) gives it, the keywords the
  project passes are parameters of it, and the environment variables the project reads or
  advises on are ones torch_npu reads (:func:`missing`, which a test runs on a wheel's copy
  with one name deleted);
- the behaviours the fake emulates are in the sources as the fake has them: the entry point,
  the autoload switch, the import order and error types and texts, the ascending rule, the
  profiler's path rule, swallowed exceptions and folder names, transfer_to_npu's side effects;
- what differs between the wheels is what the fake's ``VERSION_RULES`` says for that version
  (the ``is_available()`` rule, the autoload switch restored at import).

Where the registry cannot be reached the tests are skipped with pip's reason; under CI
(``CI=true``) they fail instead.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import in_ci

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakes" / "torch_npu"
CACHE_ROOT = ROOT / "build"
# the wheels bootstrap installs on CANN 9.1.x and on CANN 9.2.0 (the 2.7 and 2.10 lines of each)
VERSIONS = ("2.7.1.post10", "2.10.0.post6", "2.7.1.post11", "2.10.0.post7")
# The Python sources are byte-identical across the wheel's platforms: one wheel stands for all.
PIP_ARGS = ("--no-deps", "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
            "--implementation", "cp", "--abi", "cp311")
KEEP = re.compile(r"torch_npu/.*\.(py|json|yaml)|torch_npu-[^/]+\.dist-info/(entry_points\.txt|METADATA)")


def _download(version: str) -> Path:
    cache = CACHE_ROOT / f"torch_npu-{version}-wheel"
    src = cache / "src"
    if (src / "torch_npu" / "__init__.py").is_file():
        return src
    wheels = cache / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"torch_npu-{version}-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", f"torch_npu=={version}", *PIP_ARGS,
                               "-d", str(wheels), "--disable-pip-version-check", "-q"],
                              capture_output=True, text=True, timeout=600)
        found = sorted(wheels.glob(f"torch_npu-{version}-*.whl"))
        if proc.returncode != 0 or not found:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()] or [f"exit {proc.returncode}"]
            why = f"torch_npu {version} wheel unavailable: pip download failed ({lines[-1].strip()})"
            if in_ci():
                pytest.fail(f"CI: {why}")
            pytest.skip(why)
    tmp = cache / f"src.partial-{os.getpid()}"  # complete or absent: another run may be extracting too
    with zipfile.ZipFile(found[0]) as whl:
        whl.extractall(tmp, [n for n in whl.namelist() if KEEP.fullmatch(n)])
    try:
        tmp.rename(src)
    except OSError:  # the other run was first
        shutil.rmtree(tmp)
    return src


@pytest.fixture(scope="module", params=VERSIONS)
def wheel(request) -> Path:
    return _download(request.param) / "torch_npu"


def wheel_version(wheel: Path) -> str:
    info = next(wheel.parent.glob("torch_npu-*.dist-info"))
    return info.name[len("torch_npu-"):-len(".dist-info")]


def read(wheel: Path, rel: str) -> str:
    return (wheel / rel).read_text()


def functions(source: str) -> dict[str, ast.FunctionDef]:
    """Every def in ``source`` by name (methods as Class.name), with its decorators."""
    out = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = item
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
    return out


def signature(fn: ast.FunctionDef, drop_self: bool = False) -> list[tuple[str, str, object]]:
    """[(kind, name, default)], kind "pos" or "kw" (keyword-only); default "<required>" if none."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = ["<required>"] * (len(positional) - len(args.defaults)) + [_value(d) for d in args.defaults]
    sig = [("pos", a.arg, d) for a, d in zip(positional, defaults)]
    sig += [("kw", a.arg, "<required>" if d is None else _value(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return sig[1:] if drop_self and sig and sig[0][1] == "self" else sig


def _value(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def schema(wheel: Path, name: str) -> list[tuple[str, str, object]] | None:
    """A kernel's signature from its schema: the op-plugin docs, else the codegen yaml; None if neither has it."""
    docs = read(wheel, "_op_plugin_docs.py")
    m = re.search(rf"torch_npu\.\s*{name}\((.*?)\)\s*->", docs)
    if m is None:
        yaml = read(wheel, "csrc/aten/npu_native_functions_by_codegen.yaml")
        m = re.search(rf"- func: {name}\((.*?)\)\s*->", yaml)
    if m is None:
        return None
    sig, kind = [], "pos"
    for part in (p.strip() for p in m.group(1).split(",")):
        if part == "*":
            kind = "kw"
            continue
        decl, _, default = part.partition("=")
        sig.append((kind, decl.split()[-1], _schema_default(default.strip()) if default else "<required>"))
    return sig


def _schema_default(text: str):
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    if text[:1] in "'\"":
        return text.strip("'\"")
    return float(text) if re.search(r"[.e]", text) else int(text)


def strings(source: str) -> list[str]:
    """The string literals of ``source`` (implicit concatenation joined; f-strings' literal parts)."""
    return [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def says(source: str, text: str) -> bool:
    return any(text in s for s in strings(source))


def calls_in_order(fn: ast.FunctionDef) -> list[str]:
    """The names of the plain calls ``name(...)`` in ``fn``'s body, in source order."""
    found = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return [n.func.id for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def literal(source: str, name: str):
    """The value of the module-level assignment ``name = <literal>`` in ``source``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise LookupError(name)


FAKE_INIT = (FAKE / "__init__.py").read_text()
FAKE_PROFILER = (FAKE / "profiler.py").read_text()
FAKE_TRANSFER = (FAKE / "contrib" / "transfer_to_npu.py").read_text()

KERNELS = ("npu_fusion_attention", "npu_gelu", "npu_geglu", "npu_rms_norm")
# torch.npu functions: named in the project's sources, or reached through getattr(torch, kind)
# (phases.py's synchronize / peak memory, device/choice.py's set_device / current_device, autocast's dtypes).
NPU_FUNCTIONS = ("is_available", "device_count", "set_device", "current_device", "get_device_name",
                 "get_device_properties", "synchronize", "reset_peak_memory_stats", "max_memory_allocated",
                 "get_amp_supported_dtype")
PROFILER_FUNCTIONS = ("tensorboard_trace_handler", "profile.__init__")
CHECKED_NAMES = ({f"torch_npu.{k}" for k in KERNELS} | {f"torch.npu.{f}" for f in NPU_FUNCTIONS}
                 | {"torch.npu.matmul.allow_hf32", "torch.npu.conv.allow_hf32", "torch_npu.profiler",
                    "torch_npu.contrib.transfer_to_npu"})
# the variables the project reads or advises on for torch_npu, and the wheel's file that reads each
ENV_READERS = {"ASCEND_RT_VISIBLE_DEVICES": "npu/__init__.py", "ASCEND_HOME_PATH": "utils/npu_intercept.py",
               "ASCEND_OPP_PATH": "utils/npu_intercept.py", "TORCH_DEVICE_BACKEND_AUTOLOAD": "__init__.py"}
# launch's NPU defaults that torch_npu's Python reads (checked), and those CANN, HCCL or torch_npu's
# C++ read (not in the wheel's Python sources; only a real NPU shows that they act)
READ_IN_PYTHON = {"TASK_QUEUE_ENABLE", "NPU_ASD_ENABLE", "ACLNN_CACHE_LIMIT", "PYTORCH_NPU_ALLOC_CONF",
                  "ASCEND_GLOBAL_LOG_LEVEL", "ASCEND_LAUNCH_BLOCKING"}
READ_NATIVELY = {"COMBINED_ENABLE", "CPU_AFFINITY_CONF", "HCCL_CONNECT_TIMEOUT", "HCCL_BUFFSIZE",
                 "MULTI_STREAM_MEMORY_REUSE", "ASCEND_SLOG_PRINT_TO_STDOUT"}


def project_names() -> set[str]:
    """torch_npu.* / torch.npu.* names in src/, overlay/ and what the patches add."""
    texts = [p.read_text() for d in ("src", "overlay") for p in (ROOT / d).rglob("*.py")]
    texts += [ln for p in (ROOT / "patches").glob("*.patch") for ln in p.read_text().splitlines() if ln.startswith("+")]
    found = {m for t in texts for m in re.findall(r"\btorch(?:_npu|\.npu)(?:\.[A-Za-z_]\w*)+", t)}
    # a variable named torch_npu that holds a version string (torch_stack's ``torch_npu.split("+")``)
    return {m for m in found if not (m.startswith("torch_npu.") and hasattr(str, m.split(".")[1]))}


def project_keyword_calls() -> list[tuple[Path, str, set[str]]]:
    """Calls of the kernels and of the profiler in src/ and overlay/: (file, function, keywords passed)."""
    names = {*KERNELS, "tensorboard_trace_handler", "profile"}
    found = []
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "overlay").rglob("*.py")]:
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
                if node.func.attr == "profile" and "from torch_npu import profiler" not in text:
                    continue
                found.append((path, node.func.attr, {k.arg for k in node.keywords if k.arg}))
    return found


def missing(wheel: Path) -> list[str]:
    """What the project uses of torch_npu, or the fake offers in its place, that ``wheel`` (the
    extracted ``torch_npu`` folder) lacks: one line per problem, none for a good wheel."""
    problems: list[str] = []

    def text(rel: str) -> str:
        if not (wheel / rel).is_file():
            problems.append(f"{rel}: not in the wheel")
            return ""
        return read(wheel, rel)

    fake = functions(FAKE_INIT)
    docs, yaml = text("_op_plugin_docs.py"), text("csrc/aten/npu_native_functions_by_codegen.yaml")
    custom_ops = text("utils/custom_ops.py")
    kernels = {}
    if docs and yaml:
        for name in KERNELS:
            kernels[name] = schema(wheel, name)
            if kernels[name] is None:
                problems.append(f"torch_npu.{name}: no schema")
            elif kernels[name] != signature(fake[name]):
                problems.append(f"torch_npu.{name}: schema {kernels[name]} is not the fake's {signature(fake[name])}")
            if f"torch_npu.{name} = torch.ops.npu.{name}\n" not in custom_ops:
                problems.append(f"torch_npu.{name}: not bound in utils/custom_ops.py")

    npu = text("npu/__init__.py")
    exported = ast.literal_eval(re.search(r"__all__ = (\[.*?\])", npu, re.S).group(1)) if "__all__ = [" in npu else []
    defs = {}
    for path in sorted((wheel / "npu").glob("*.py")):
        defs.update({k: v for k, v in functions(path.read_text()).items() if "." not in k and k not in defs})
    for name in NPU_FUNCTIONS:
        if name not in exported:
            problems.append(f"torch.npu.{name}: not in torch_npu.npu.__all__")
        if name not in defs:
            problems.append(f"torch.npu.{name}: no def in torch_npu/npu/")
        elif signature(defs[name]) != signature(fake[f"_FakeNpuModule.{name}"], drop_self=True):
            problems.append(f"torch.npu.{name}: signature {signature(defs[name])} is not the fake's")
    if not ("matmul = npu_config._allowHF32Matmul()" in npu and "conv = npu_config._allowHF32Conv()" in npu):
        problems.append("torch.npu.matmul / torch.npu.conv: not the npu_config HF32 switches")
    if "allow_hf32" not in text("npu/npu_config.py"):
        problems.append("torch.npu.matmul.allow_hf32 / conv.allow_hf32: no allow_hf32 in npu/npu_config.py")

    profiler = functions(text("profiler/profiler.py") or "")
    fake_profiler = functions(FAKE_PROFILER)
    params = {name: {n for _, n, _ in schema_} for name, schema_ in kernels.items() if schema_}
    for name in PROFILER_FUNCTIONS:
        if name not in profiler:
            problems.append(f"torch_npu.profiler.{name}: no def in profiler/profiler.py")
            continue
        real = signature(profiler[name], drop_self=True)
        if real != signature(fake_profiler[name], drop_self=True):
            problems.append(f"torch_npu.profiler.{name}: signature {real} is not the fake's")
        params[name.split(".")[0]] = {n for _, n, _ in real}
    for path, name, keywords in project_keyword_calls():
        unknown = keywords - params.get(name, keywords)
        if unknown:
            problems.append(f"{path.relative_to(ROOT)}: {name}() is passed {sorted(unknown)}, not parameters of it")
    text("contrib/transfer_to_npu.py")

    for var, rel in ENV_READERS.items():
        if f'"{var}"' not in text(rel):
            problems.append(f"{var}: not read in {rel}")
    everything = "\n".join(p.read_text() for p in wheel.rglob("*.py"))
    problems += [f"{var}: not read in torch_npu's Python" for var in sorted(READ_IN_PYTHON) if var not in everything]
    return problems


def wheel_rules(wheel: Path) -> dict:
    """What the fake's VERSION_RULES says of a version, read from that wheel's sources."""
    npu = read(wheel, "npu/__init__.py")
    defs = functions(npu)
    body = ast.unparse(defs["is_available"])
    hal = ast.unparse(defs["_hal_based_avail"]) if "_hal_based_avail" in defs else ""
    if "return torch_npu._C._npu_getDeviceCount() > 0" in body and "if _hal_based_avail():\n        return " \
            "device_count() > 0" in body and "return os.getenv('PYTORCH_HAL_BASED_NPU_CHECK') == '1'" in hal:
        rule = "runtime_count"
    elif body.endswith("return device_count() > 0") and "_npu_getDeviceCount" not in body:
        rule = "device_count"
    else:
        rule = f"neither: {body}"
    restored = any(isinstance(n, ast.Expr) and ast.unparse(n) == "_autoload()"
                   for n in ast.parse(read(wheel, "__init__.py")).body)
    realpath = functions(read(wheel, "profiler/analysis/prof_common_func/_path_manager.py"))
    word = re.search(r"Invalid input path is a (.*?): ", ast.unparse(realpath["ProfilerPathManager.get_realpath"]))
    return {"is_available": rule, "autoload_restored_on_import": restored, "symlink_word": word and word.group(1)}


def test_every_name_the_project_uses_is_checked_here():
    assert project_names() - CHECKED_NAMES == set(), "add the new torch_npu names to this test and to the fake"


def test_the_scan_finds_the_projects_calls():
    seen = {name for _, name, _ in project_keyword_calls()}
    assert {"npu_fusion_attention", "npu_gelu", "npu_rms_norm", "tensorboard_trace_handler", "profile"} <= seen


def test_the_wheel_has_every_name_keyword_and_variable_the_project_uses(wheel):
    assert missing(wheel) == []


@pytest.fixture(scope="module")
def wheel_copy(tmp_path_factory) -> Path:
    """A copy of one wheel's sources that a test may edit (and puts back)."""
    copy = tmp_path_factory.mktemp("wheel") / "torch_npu"
    shutil.copytree(_download("2.10.0.post6") / "torch_npu", copy)
    return copy


@pytest.mark.parametrize("rel, old, new, reported", [
    ("npu/__init__.py", "def is_available(", "def _gone(", "torch.npu.is_available: no def"),
    ("npu/__init__.py", '"is_available",', "", "torch.npu.is_available: not in torch_npu.npu.__all__"),
    ("csrc/aten/npu_native_functions_by_codegen.yaml", "- func: npu_gelu(", "- func: npu_gone(",
     "torch_npu.npu_gelu: no schema"),
    ("_op_plugin_docs.py", "float epsilon=1e-06", "float eps=1e-06", "torch_npu.npu_rms_norm: schema"),
    ("utils/custom_ops.py", "torch_npu.npu_geglu = torch.ops.npu.npu_geglu\n", "",
     "torch_npu.npu_geglu: not bound"),
    ("profiler/profiler.py", "custom_trace_id_callback", "trace_id_callback",
     "torch_npu.profiler.profile.__init__: signature"),
    ("profiler/profiler.py", "record_shapes", "shapes", "profile() is passed ['record_shapes']"),
    ("npu/__init__.py", '"ASCEND_RT_VISIBLE_DEVICES"', '"ASCEND_VISIBLE"', "ASCEND_RT_VISIBLE_DEVICES: not read"),
    ("npu/npu_config.py", "allow_hf32", "allow_hf", "no allow_hf32"),
])
def test_a_name_removed_from_a_wheel_is_reported(wheel_copy, rel, old, new, reported):
    source = read(wheel_copy, rel)
    assert old in source
    (wheel_copy / rel).write_text(source.replace(old, new))
    try:
        problems = missing(wheel_copy)
    finally:
        (wheel_copy / rel).write_text(source)
    assert [p for p in problems if reported in p], problems


# What the project's varlen call (overlay attention_fallback.py, layout TND) and the fake's TND
# rely on, as each wheel's npu_fusion_attention docs say it (text of the docstring, verbatim).
VARLEN_DOCS = (
    "TND(actual_seq_qlen/actual_seq_kvlen需传值)",  # TND needs both lists
    "比如真正的S长度列表为: 2 2 2 2 2, 则actual_seq_qlen传: 2 4 6 8 10",  # cumulative lengths
    "取值为1(或True)代表该位不参与计算(被遮蔽)",  # atten_mask: True = masked out
    "sparse_mode为3时, 代表rightDownCausal模式的mask, 对应以右下顶点划分的下三角场景(参数起点为右下角). "
    "该场景下忽略pre_tockens、next_tockens取值. atten_mask为优化后的压缩下三角矩阵(2048*2048)",
    "当atten_mask输入为None时, sparse_mode, pre_tockens, next_tockens参数不生效, 固定为全计算",
    "要求T(B*S)取值范围1~1M",  # the fake's MAX_TOKENS
    "varlen场景下长度最大支持1K",  # the fake's MAX_VARLEN_BATCH
)
# the parameters of the varlen call, with their schema types: int[] (Python lists of ints), not
# the Tensor? that npu_fusion_attention_v3 takes for the lengths
VARLEN_TYPES = {"input_layout": "str", "atten_mask": "Tensor?", "actual_seq_qlen": "int[]?",
                "actual_seq_kvlen": "int[]?", "sparse_mode": "int"}


def typed_schema(wheel: Path, name: str) -> dict[str, str]:
    """{parameter: type} from the op-plugin docs' signature of ``name``."""
    m = re.search(rf"torch_npu\.\s*{name}\((.*?)\)\s*->", read(wheel, "_op_plugin_docs.py"))
    parts = [p.strip().partition("=")[0].split() for p in m.group(1).split(",") if p.strip() != "*"] if m else []
    return {p[-1]: " ".join(p[:-1]) for p in parts}


def varlen_call() -> ast.Call:
    """The project's ``npu_fusion_attention(..., "TND", ...)`` call."""
    source = (ROOT / "overlay" / "dancegrpo_port" / "models" / "attention_fallback.py").read_text()
    found = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "npu_fusion_attention" and any(
                 isinstance(a, ast.Constant) and a.value == "TND" for a in n.args)]
    assert len(found) == 1, "one TND call of npu_fusion_attention in attention_fallback.py"
    return found[0]


def varlen_problems(wheel: Path) -> list[str]:
    """Where ``wheel``'s npu_fusion_attention differs from what the varlen call and the fake's TND
    take of it: one line per problem, none for a good wheel."""
    docs = read(wheel, "_op_plugin_docs.py")
    start = docs.find('"npu_fusion_attention",')
    text = docs[start:docs.find("_add_torch_npu_docstr", start)] if start >= 0 else ""
    problems = [f"npu_fusion_attention docs: not {line!r}" for line in VARLEN_DOCS if line not in text]
    types = typed_schema(wheel, "npu_fusion_attention")
    problems += [f"npu_fusion_attention: {name} is {types.get(name)!r} in the schema, not {kind!r}"
                 for name, kind in VARLEN_TYPES.items() if types.get(name) != kind]
    call = varlen_call()
    passed = {k.arg for k in call.keywords}
    problems += [f"attention_fallback.py: the TND call does not pass {name}" for name in
                 ("actual_seq_qlen", "actual_seq_kvlen", "atten_mask", "sparse_mode") if name not in passed]
    problems += [f"attention_fallback.py: the TND call passes {name}, not in the schema"
                 for name in sorted(passed - set(types))]
    overlay = (ROOT / "overlay" / "dancegrpo_port" / "models" / "attention_fallback.py").read_text()
    side = re.search(r"压缩下三角矩阵\((\d+)\*(\d+)\)", text)
    side = int(side.group(1)) if side else None
    if not literal(overlay, "COMPRESSED_MASK_SIDE") == literal(FAKE_INIT, "COMPRESSED_MASK_SIDE") == side:
        problems.append(f"the compressed causal mask is {side}x{side} in the docs, not the overlay's or fake's")
    if literal(overlay, "RIGHT_DOWN_CAUSAL") != 3 or not re.search(r"\n3: rightDownCausal模式\.", text):
        problems.append("sparse_mode 3 is not rightDownCausal")
    return problems


def test_the_varlen_call_follows_the_wheels_schema_and_docs(wheel):
    assert varlen_problems(wheel) == []


@pytest.mark.parametrize("old, new, reported", [
    ("int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
     "bool sync=False, str softmax_layout=\"\") -> (Tensor, Tensor, Tensor, Tensor, int, int, int)",
     "Tensor? actual_seq_qlen=None, Tensor? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
     "bool sync=False, str softmax_layout=\"\") -> (Tensor, Tensor, Tensor, Tensor, int, int, int)",
     "actual_seq_qlen is 'Tensor?' in the schema"),
    ("取值为1(或True)代表该位不参与计算(被遮蔽)", "取值为1(或True)代表该位参与计算", "not '取值为1(或True)"),
    ("atten_mask为优化后的压缩下三角矩阵(2048*2048)", "atten_mask为优化后的压缩下三角矩阵(1024*1024)",
     "the compressed causal mask is"),
])
def test_a_varlen_rule_changed_in_a_wheel_is_reported(wheel_copy, old, new, reported):
    rel = "_op_plugin_docs.py"
    source = read(wheel_copy, rel)
    assert old in source
    (wheel_copy / rel).write_text(source.replace(old, new))
    try:
        problems = varlen_problems(wheel_copy)
    finally:
        (wheel_copy / rel).write_text(source)
    assert [p for p in problems if reported in p], problems


def test_the_fake_says_which_wheel_it_follows():
    rules = literal(FAKE_INIT, "VERSION_RULES")
    assert tuple(rules) == VERSIONS
    default = literal(FAKE_INIT, "DEFAULT_EMULATES")
    assert default == "2.10.0.post6" and default in rules
    info = [p.name for p in FAKE.parent.glob("torch_npu-*.dist-info")]
    assert info == [f"torch_npu-{default}+fake.dist-info"]


def test_what_differs_between_wheels_is_what_the_fake_says_for_that_version(wheel):
    assert wheel_rules(wheel) == literal(FAKE_INIT, "VERSION_RULES")[wheel_version(wheel)]


def test_entry_point_and_autoload(wheel):
    entry = next(wheel.parent.glob("torch_npu-*.dist-info")) / "entry_points.txt"
    assert "[torch.backends]\ntorch_npu = torch_npu:_autoload" in entry.read_text()
    fake_entry = next((FAKE.parent).glob("torch_npu-*.dist-info")) / "entry_points.txt"
    assert fake_entry.read_text().strip() == "[torch.backends]\ntorch_npu = torch_npu:_autoload"
    init = read(wheel, "__init__.py")
    for line in ('ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")',
                 'os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"',
                 'os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = ORG_AUTOLOAD'):
        assert line in init and line in FAKE_INIT, line
    assert "_autoload" in functions(init) and "_autoload" in functions(FAKE_INIT)


def test_import_order_error_types_and_texts(wheel):
    """A second accelerator is refused first; then ``torch_npu._C`` is imported before the code that
    adds CANN's advice to a missing libhccl.so (a bare ImportError); the CANN package check last."""
    init = read(wheel, "__init__.py")
    order = calls_in_order(functions(init)["_initialize"])
    assert order[:2] == ["_load_core_modules", "_register_components"]
    assert init.index("\n_check_device_conflict()\n") < init.index("\n_initialize()\n")
    assert 'if acc.type not in ("cpu", "npu"):' in init
    assert 'if _accelerator.type not in ("cpu", "npu"):' in FAKE_INIT
    assert says(init, "Two accelerators cannot be used at the same time") and \
        says(FAKE_INIT, "Two accelerators cannot be used at the same time")
    loader = functions(read(wheel, "_init/core/module_loader.py"))
    order = calls_in_order(loader["_load_core_modules"])
    assert order.index("_initialize_c_extension_children") < order.index("_check_npu_import")
    assert "import torch_npu._C as _C" in ast.unparse(loader["_initialize_c_extension_children"])
    advice = ast.unparse(loader["_check_npu_import"])
    assert "import torch_npu.npu" in advice and "if 'libhccl.so' in str(e):" in advice
    assert "Please check that the cann package is installed. " in advice  # ... never reached for libhccl.so
    assert "Please check that the cann package" not in FAKE_INIT[FAKE_INIT.index("from __future__"):]
    assert "ImportError(\"libhccl.so: cannot open shared object file: No such file or directory\",\n" \
           "                      name=\"torch_npu._C\")" in FAKE_INIT
    registry = read(wheel, "_init/registry/registry_manager.py")
    assert "from torch_npu.utils.npu_intercept import _cann_package_check" in registry
    assert "_cann_package_check" in calls_in_order(functions(registry)["_register_npu_backend"])
    check = read(wheel, "utils/npu_intercept.py")
    body = check[check.index("def _cann_package_check"):]
    assert body.count("raise Exception(") >= 5 and says(body, " does not exist. Please run 'source set_env.sh' in ")
    assert says(FAKE_INIT, " does not exist. Please run 'source set_env.sh' in ")
    assert 'raise AssertionError("Invalid device id"' in read(wheel, "npu/__init__.py")
    assert 'raise AssertionError("Invalid device id"' in FAKE_INIT


def test_visible_devices_rule(wheel):
    npu = read(wheel, "npu/__init__.py")
    hal = npu[npu.index("def _device_count_ascend_hal"):npu.index("def device_count")]
    assert "if idx > 0 and val <= visible_devices[idx - 1]:\n                return 0" in hal  # ascending, else none
    assert "if cast(int, val) >= raw_cnt:\n                return idx" in hal  # cut at the first missing id
    assert 'os.getenv("ASCEND_RT_VISIBLE_DEVICES")' in npu and "return list(range(64))" in npu
    assert "if idx > 0 and val <= visible[idx - 1]:" in FAKE_INIT and "if val >= present:\n            return idx" \
        in FAKE_INIT


def test_profiler_rules(wheel):
    from dancegrpo_npu.host import ascend

    paths = read(wheel, "utils/_path_manager.py")
    pattern = re.search(r"pattern = r'(.*)'", paths).group(1)
    assert pattern == ascend.PROFILER_PATH_PATTERN
    assert f'PATH_PATTERN = r"{pattern}"' in FAKE_PROFILER
    assert "MAX_PATH_LENGTH = 4096" in paths and "MAX_FILE_NAME_LENGTH = 255" in paths
    creator = read(wheel, "profiler/_profiler_path_creator.py")
    assert "dir_path = ProfilerPathManager.get_realpath(dir_name)" in creator  # the real, absolute path
    assert "PathManager.check_input_directory_path(self._prof_path)" in creator  # the whole trace folder
    # the rule warns and the trace is written: nothing in it raises (2.7.1 without a post release raised)
    manager = functions(paths)
    common = ast.unparse(manager["PathManager._input_path_common_check"])
    assert "raise" not in common and common.count("warnings.warn(") == 4
    realpath = ast.unparse(functions(read(wheel, "profiler/analysis/prof_common_func/_path_manager.py"))[
        "ProfilerPathManager.get_realpath"])
    assert "if os.path.islink(path):" in realpath and "warnings.warn(msg)" in realpath
    assert realpath.count("raise ") == 1 and "Input path is empty" in realpath  # the one refusal: ''
    fake_realpath = ast.unparse(functions(FAKE_PROFILER)["_get_realpath"])
    assert "warnings.warn(" in fake_realpath and fake_realpath.count("raise ") == 1
    check = ast.unparse(manager["PathManager.check_input_directory_path"])
    assert "cls._input_path_common_check(path)" in check and "if os.path.isfile(path):" in check
    fake = ast.unparse(functions(FAKE_PROFILER)["_check_input_directory_path"])
    assert fake.count("warnings.warn(") == 4 and fake.count("raise ") == 1 and "os.path.isfile(path)" in fake
    assert 'self._worker_name or socket.gethostname(),\n            str(os.getpid())' in creator
    assert 'span_name = "{}_{}_ascend_pt".format(worker_name, current_time.strftime("%Y%m%d%H%M%S%f")[:-3])' in creator
    profiler = functions(read(wheel, "profiler/profiler.py"))
    fake = functions(FAKE_PROFILER)
    for name in ("tensorboard_trace_handler", "profile.start", "profile.stop", "profile.step"):
        decorators = [ast.unparse(d) for d in profiler[name].decorator_list]
        assert "no_exception_func()" in decorators, name  # logs the exception and returns None
        assert "no_exception_func()" in [ast.unparse(d) for d in fake[name].decorator_list], name
    assert signature(fake["profile.__init__"])[-2:] == [("kw", "custom_trace_id_callback", None),
                                                        ("kw", "use_cuda", None)]
    swallow = read(wheel, "profiler/analysis/prof_common_func/_utils.py")
    assert 'print_error_msg(f"Call {func.__name__} failed. Exception: {str(ex)}")' in swallow
    assert "from torch_npu._C._profiler import ProfilerActivity" in read(wheel, "profiler/__init__.py")


def test_transfer_to_npu_side_effects(wheel):
    source = read(wheel, "contrib/transfer_to_npu.py")
    composed = "torch.distributed.init_process_group = _compose_wrappers(_wrapper_cuda, _wrapper_hccl)("
    for line in ("warnings.filterwarnings(action='once')", "torch.jit.script = _jit_script",
                 "torch.Tensor.is_cuda = torch.Tensor.is_npu", composed,
                 "torch.distributed.is_nccl_available = torch.distributed.is_hccl_available",
                 "_do_wrapper_libraries_func(_load_json_file(config_path))"):
        assert line in source, line
    assert composed in FAKE_TRANSFER
    defs = functions(source)
    assert "for wrapper in wrappers:\n            f = wrapper(f)" in ast.unparse(defs["_compose_wrappers"])
    hccl = ast.unparse(defs["_wrapper_hccl"])
    for rewrite in ("arg = arg.replace('nccl', 'hccl')", "arg = arg.replace('cuda', 'npu')",
                    "backend = backend.replace('nccl', 'hccl')", "backend = backend.replace('cuda', 'npu')"):
        assert rewrite in hccl, rewrite
    assert literal(source, "device_kwargs_list") == list(literal(FAKE_TRANSFER, "DEVICE_KWARGS"))
    to_npu = ast.unparse(defs["_replace_cuda_to_npu_in_kwargs"])
    assert "kwargs[device_arg] = f'npu:{device}'" in to_npu  # an int device keyword
    config = json.loads(read(wheel, "contrib/apis_config.json"))
    fake_config = ast.literal_eval(re.search(r"APIS_CONFIG = (\{.*?\n\})", FAKE_TRANSFER, re.S).group(1))
    assert {k: (v["version"], v["apis"]) for k, v in config.items()} == fake_config
    assert "accelerate.state.PartialState._prepare_backend" in config["accelerate"]["apis"]


def test_environment_variables_torch_reads():
    """Each variable the project reads or advises on for torch_npu is one torch_npu (:func:`missing`)
    or torch reads."""
    torch_init = Path(__import__("importlib").util.find_spec("torch").origin).read_text()
    assert 'os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"' in torch_init
    assert "Failed to load the backend extension: {backend_extension.name}" in torch_init
    used = " ".join(p.read_text() for d in ("src", "overlay") for p in (ROOT / d).rglob("*.py"))
    assert {"ASCEND_RT_VISIBLE_DEVICES", "TORCH_DEVICE_BACKEND_AUTOLOAD"} <= set(re.findall(r"[A-Z_]{6,}", used))


def test_launchs_npu_defaults_are_classified():
    from dancegrpo_npu.host import ascend

    assert {d.name for d in ascend.NPU_ENV_DEFAULTS} == READ_IN_PYTHON | READ_NATIVELY


@pytest.mark.parametrize("ci", ["", "true"])
def test_an_unreachable_registry_skips_with_the_reason_and_fails_under_ci(tmp_path, monkeypatch, ci):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(module, "PIP_ARGS", PIP_ARGS + ("--index-url", "http://127.0.0.1:9/simple", "--retries", "0",
                                                        "--timeout", "2"))
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected) as e:
        _download("2.10.0.post6")
    assert "torch_npu 2.10.0.post6 wheel unavailable: pip download failed (" in str(e.value.msg)
    assert str(e.value.msg).startswith("CI: ") == bool(ci)
