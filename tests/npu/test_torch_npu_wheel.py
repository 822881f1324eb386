"""The torch_npu the project talks to is the real 2.7.1, read from its wheel's sources.

The wheel is downloaded with pip once and cached under build/ (its Python sources, the entry
points and the kernel schemas; no shared library is unpacked).  Nothing of it is imported: the
sources are read with ``ast`` and as text.  Checked:

- every ``torch_npu.*`` and ``torch.npu.*`` name in src/, overlay/ and the patches' added lines
  (and the ``torch.npu`` functions the overlay reaches through ``getattr(torch, kind)``) exists
  in the wheel, with the signature the FAKE (tests/fakes/torch_npu) gives it, and the keywords
  the project passes are parameters of it;
- the behaviours the fake emulates are in the sources as the fake has them: the entry point,
  the autoload switch, the ascending rule, the profiler's path rule, swallowed exceptions and
  folder names, transfer_to_npu's side effects, the error types and texts;
- the environment variables the project reads or advises on are the ones torch_npu reads.

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
CACHE = ROOT / "build" / "torch_npu-2.7.1-wheel"
VERSION = "2.7.1"
# The Python sources are byte-identical across the wheel's platforms: one wheel stands for all.
PIP_ARGS = ("--no-deps", "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
            "--implementation", "cp", "--abi", "cp311")
KEEP = re.compile(r"torch_npu/.*\.(py|json|yaml)|torch_npu-[^/]+\.dist-info/(entry_points\.txt|METADATA)")


def _download() -> Path:
    src = CACHE / "src"
    if (src / "torch_npu" / "__init__.py").is_file():
        return src
    wheels = CACHE / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"torch_npu-{VERSION}-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", f"torch_npu=={VERSION}", *PIP_ARGS,
                               "-d", str(wheels), "--disable-pip-version-check", "-q"],
                              capture_output=True, text=True, timeout=600)
        found = sorted(wheels.glob(f"torch_npu-{VERSION}-*.whl"))
        if proc.returncode != 0 or not found:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()] or [f"exit {proc.returncode}"]
            why = f"torch_npu {VERSION} wheel unavailable: pip download failed ({lines[-1].strip()})"
            if in_ci():
                pytest.fail(f"CI: {why}")
            pytest.skip(why)
    tmp = CACHE / f"src.partial-{os.getpid()}"  # complete or absent: another run may be extracting too
    with zipfile.ZipFile(found[0]) as whl:
        whl.extractall(tmp, [n for n in whl.namelist() if KEEP.fullmatch(n)])
    try:
        tmp.rename(src)
    except OSError:  # the other run was first
        shutil.rmtree(tmp)
    return src


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _download() / "torch_npu"


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


def schema(wheel: Path, name: str) -> list[tuple[str, str, object]]:
    """A kernel's signature from its schema: the op-plugin docs, else the codegen yaml."""
    docs = read(wheel, "_op_plugin_docs.py")
    m = re.search(rf"torch_npu\.\s*{name}\((.*?)\)\s*->", docs)
    if m is None:
        yaml = read(wheel, "csrc/aten/npu_native_functions_by_codegen.yaml")
        m = re.search(rf"- func: {name}\((.*?)\)\s*->", yaml)
    assert m, f"torch_npu {VERSION} has no schema for {name}"
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


FAKE_INIT = (FAKE / "__init__.py").read_text()
FAKE_PROFILER = (FAKE / "profiler.py").read_text()
FAKE_TRANSFER = (FAKE / "contrib" / "transfer_to_npu.py").read_text()

KERNELS = ("npu_fusion_attention", "npu_gelu", "npu_geglu", "npu_rms_norm")
# torch.npu functions: named in the project's sources, or reached through getattr(torch, kind)
# (phases.py's synchronize / peak memory, device.py's set_device / current_device, autocast's dtypes).
NPU_FUNCTIONS = ("is_available", "device_count", "set_device", "current_device", "get_device_name",
                 "get_device_properties", "synchronize", "reset_peak_memory_stats", "max_memory_allocated",
                 "get_amp_supported_dtype")
CHECKED_NAMES = ({f"torch_npu.{k}" for k in KERNELS} | {f"torch.npu.{f}" for f in NPU_FUNCTIONS}
                 | {"torch.npu.matmul.allow_hf32", "torch.npu.conv.allow_hf32", "torch_npu.profiler",
                    "torch_npu.contrib.transfer_to_npu"})


def project_names() -> set[str]:
    """torch_npu.* / torch.npu.* names in src/, overlay/ and what the patches add."""
    texts = [p.read_text() for d in ("src", "overlay") for p in (ROOT / d).rglob("*.py")]
    texts += [ln for p in (ROOT / "patches").glob("*.patch") for ln in p.read_text().splitlines() if ln.startswith("+")]
    return {m for t in texts for m in re.findall(r"\btorch(?:_npu|\.npu)(?:\.[A-Za-z_]\w*)+", t)}


def test_every_name_the_project_uses_is_checked_here():
    assert project_names() - CHECKED_NAMES == set(), "add the new torch_npu names to this test and to the fake"


def test_kernels_have_the_fakes_signatures(wheel):
    fake = functions(FAKE_INIT)
    for name in KERNELS:
        assert signature(fake[name]) == schema(wheel, name), name
        assert f"torch_npu.{name} = torch.ops.npu.{name}\n" in read(wheel, "utils/custom_ops.py"), name


def test_keywords_the_project_passes_are_parameters(wheel):
    """Calls of the kernels and of the profiler in src/ and overlay/: each keyword is one of theirs."""
    real = {name: {n for _, n, _ in schema(wheel, name)} for name in KERNELS}
    profiler = functions(read(wheel, "profiler/profiler.py"))
    real["tensorboard_trace_handler"] = {n for _, n, _ in signature(profiler["tensorboard_trace_handler"])}
    real["profile"] = {n for _, n, _ in signature(profiler["profile.__init__"], drop_self=True)}
    seen = set()
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "overlay").rglob("*.py")]:
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in real:
                if node.func.attr == "profile" and "from torch_npu import profiler" not in text:
                    continue
                keywords = {k.arg for k in node.keywords if k.arg}
                assert keywords <= real[node.func.attr], (path, node.func.attr, keywords - real[node.func.attr])
                seen.add(node.func.attr)
    assert {"npu_fusion_attention", "npu_gelu", "npu_rms_norm", "tensorboard_trace_handler", "profile"} <= seen


def test_npu_module_functions_exist_with_the_fakes_signatures(wheel):
    exported = ast.literal_eval(re.search(r"__all__ = (\[.*?\])", read(wheel, "npu/__init__.py"), re.S).group(1))
    defs = {}
    for path in sorted((wheel / "npu").glob("*.py")):
        defs.update({k: v for k, v in functions(path.read_text()).items() if "." not in k and k not in defs})
    fake = functions(FAKE_INIT)
    for name in NPU_FUNCTIONS:
        assert name in exported, name
        assert signature(fake[f"_FakeNpuModule.{name}"], drop_self=True) == signature(defs[name]), name
    config = read(wheel, "npu/__init__.py")
    assert "matmul = npu_config._allowHF32Matmul()" in config and "conv = npu_config._allowHF32Conv()" in config
    assert "allow_hf32" in read(wheel, "npu/npu_config.py")


def test_entry_point_and_autoload(wheel):
    entry = next((wheel.parent).glob(f"torch_npu-{VERSION}.dist-info")) / "entry_points.txt"
    assert "[torch.backends]\ntorch_npu = torch_npu:_autoload" in entry.read_text()
    fake_entry = next((FAKE.parent).glob("torch_npu-*.dist-info")) / "entry_points.txt"
    assert fake_entry.read_text().strip() == "[torch.backends]\ntorch_npu = torch_npu:_autoload"
    init = read(wheel, "__init__.py")
    for line in ('ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")',
                 'os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"',
                 'os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = ORG_AUTOLOAD'):
        assert line in init and line in FAKE_INIT, line
    assert "_autoload" in functions(init) and "_autoload" in functions(FAKE_INIT)


def test_error_types_and_texts(wheel):
    init = read(wheel, "__init__.py")
    assert 'if "libhccl.so" in str(e):' in init and "raise\n" in init  # the ImportError, with text added
    for text in ("Please check that the cann package is installed. ", "Please check that the compiler package is "
                 "installed. ", "Please run 'source set_env.sh' in the CANN installation path.",
                 "Two accelerators cannot be used at the same time"):
        assert says(init, text) and says(FAKE_INIT, text), text
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
    assert "return os.path.realpath(path)" in read(wheel, "profiler/analysis/prof_common_func/_path_manager.py")
    assert 'self._worker_name or socket.gethostname(),\n            str(os.getpid())' in creator
    assert 'span_name = "{}_{}_ascend_pt".format(worker_name, current_time.strftime("%Y%m%d%H%M%S%f")[:-3])' in creator
    profiler = functions(read(wheel, "profiler/profiler.py"))
    fake = functions(FAKE_PROFILER)
    for name in ("tensorboard_trace_handler", "profile.start", "profile.stop", "profile.step"):
        decorators = [ast.unparse(d) for d in profiler[name].decorator_list]
        assert "no_exception_func()" in decorators, name  # logs the exception and returns None
        assert "no_exception_func()" in [ast.unparse(d) for d in fake[name].decorator_list], name
    assert signature(fake["tensorboard_trace_handler"]) == signature(profiler["tensorboard_trace_handler"])
    assert signature(fake["profile.__init__"]) == signature(profiler["profile.__init__"])
    swallow = read(wheel, "profiler/analysis/prof_common_func/_utils.py")
    assert 'print_error_msg(f"Call {func.__name__} failed. Exception: {str(ex)}")' in swallow
    assert "from torch_npu._C._profiler import ProfilerActivity" in read(wheel, "profiler/__init__.py")


def test_transfer_to_npu_side_effects(wheel):
    source = read(wheel, "contrib/transfer_to_npu.py")
    for line in ("warnings.filterwarnings(action='once')", "torch.jit.script = _jit_script",
                 "torch.Tensor.is_cuda = torch.Tensor.is_npu",
                 "torch.distributed.init_process_group = _wrapper_hccl(torch.distributed.init_process_group)",
                 "torch.distributed.is_nccl_available = torch.distributed.is_hccl_available",
                 "_do_wrapper_libraries_func(_load_json_file(config_path))"):
        assert line in source, line
    assert "args_new[idx] = arg.replace('nccl', 'hccl')" in source
    config = json.loads(read(wheel, "contrib/apis_config.json"))
    fake_config = ast.literal_eval(re.search(r"APIS_CONFIG = (\{.*?\n\})", FAKE_TRANSFER, re.S).group(1))
    assert {k: (v["version"], v["apis"]) for k, v in config.items()} == fake_config
    assert "accelerate.state.PartialState._prepare_backend" in config["accelerate"]["apis"]


def test_environment_variables_the_project_names(wheel):
    """Each variable the project reads or advises on for torch_npu is one torch_npu (or torch) reads."""
    torch_init = Path(__import__("importlib").util.find_spec("torch").origin).read_text()
    assert 'os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"' in torch_init
    assert "Failed to load the backend extension: {backend_extension.name}" in torch_init
    sources = {"ASCEND_RT_VISIBLE_DEVICES": "npu/__init__.py", "ASCEND_HOME_PATH": "utils/npu_intercept.py",
               "ASCEND_OPP_PATH": "utils/npu_intercept.py", "TORCH_DEVICE_BACKEND_AUTOLOAD": "__init__.py"}
    for var, rel in sources.items():
        assert f'"{var}"' in read(wheel, rel), var
    used = " ".join(p.read_text() for d in ("src", "overlay") for p in (ROOT / d).rglob("*.py"))
    assert {"ASCEND_RT_VISIBLE_DEVICES", "TORCH_DEVICE_BACKEND_AUTOLOAD"} <= set(re.findall(r"[A-Z_]{6,}", used))


@pytest.mark.parametrize("ci", ["", "true"])
def test_an_unreachable_registry_skips_with_the_reason_and_fails_under_ci(tmp_path, monkeypatch, ci):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(module, "PIP_ARGS", PIP_ARGS + ("--index-url", "http://127.0.0.1:9/simple", "--retries", "0",
                                                        "--timeout", "2"))
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected) as e:
        _download()
    assert f"torch_npu {VERSION} wheel unavailable: pip download failed (" in str(e.value.msg)
    assert str(e.value.msg).startswith("CI: ") == bool(ci)


# launch's NPU defaults that torch_npu's Python reads (checked), and those CANN, HCCL or torch_npu's
# C++ read (not in the wheel's Python sources; only a real NPU shows that they act)
READ_IN_PYTHON = {"TASK_QUEUE_ENABLE", "NPU_ASD_ENABLE", "ACLNN_CACHE_LIMIT", "PYTORCH_NPU_ALLOC_CONF",
                  "ASCEND_GLOBAL_LOG_LEVEL", "ASCEND_LAUNCH_BLOCKING"}
READ_NATIVELY = {"COMBINED_ENABLE", "CPU_AFFINITY_CONF", "HCCL_CONNECT_TIMEOUT", "HCCL_BUFFSIZE",
                 "MULTI_STREAM_MEMORY_REUSE", "ASCEND_SLOG_PRINT_TO_STDOUT"}


def test_launchs_npu_defaults_are_classified_and_those_read_in_python_are_there(wheel):
    from dancegrpo_npu.host import ascend

    names = {d.name for d in ascend.NPU_ENV_DEFAULTS}
    assert names == READ_IN_PYTHON | READ_NATIVELY
    text = "\n".join(p.read_text() for p in wheel.rglob("*.py"))
    assert {n for n in READ_IN_PYTHON if n not in text} == set()
