#!/usr/bin/env bash
# Set everything up, then run the main job on the embedded default.
#
#   ./scripts/bootstrap.sh              .venv + dependencies, fetch + patch upstream, smoke run
#   ./scripts/bootstrap.sh --deps-only  .venv + dependencies only (what ./scripts/test.sh needs)
#   ./scripts/bootstrap.sh --no-smoke   everything but the smoke run
#   ./scripts/bootstrap.sh --with diffusers-0.35
#                                       also the diffusers-0.35 dependency set (Wan2.1,
#                                       Qwen-Image), layered on .venv (docs/dependencies.md)
#   ./scripts/bootstrap.sh --torch 2.7  on an Ascend host, the torch line to install: 2.10 (the
#                                       default), 2.7 (MindSpeed-MM's), 2.9 or 2.8
#   ./scripts/bootstrap.sh --print-torch
#                                       print the torch / torchvision / torch-npu pins this host
#                                       gets (and, on stderr, why), install nothing
#
# The torch pair: on an Ascend host it follows the host's CANN (the version file of the CANN that
# ASCEND_HOME_PATH names, else of /usr/local/Ascend/{cann,cann-*,ascend-toolkit/latest}), by
# Ascend's compatibility table (src/dancegrpo_npu/host/torch_stack.json; docs/ascend-910b.md):
# torch_npu of the chosen line for that CANN, with the CPU build of its torch (from PyTorch's CPU
# index, never a CUDA build) and the torchvision built with it.  Elsewhere: x86_64 torch 2.14.1 +
# torchvision 0.29.1, aarch64 2.9.1 + 0.24.1.
#
# Idempotent: a second run with nothing to do skips every step in seconds.
#
# Environment (all optional):
#   PYTHON=python3.12          the interpreter for .venv (3.10, 3.11 or 3.12; default: the first found)
#   DANCEGRPO_VENV=DIR         where the virtualenv lives (default: .venv)
#   DANCEGRPO_VENV_DIFFUSERS_0_35=DIR
#                              where the diffusers-0.35 set lives (default: DANCEGRPO_VENV
#                              with -diffusers-0.35 appended); the tool looks there too
#   DANCEGRPO_TORCH=2.7        the torch line, as --torch (the command line wins)
#   DANCEGRPO_TORCH="torch==X torchvision==Y [torch-npu==Z]"
#                              exact pins instead; on an Ascend host a pair the table does not
#                              list for its CANN is refused, unless DANCEGRPO_TORCH_UNCHECKED=1
#   DANCEGRPO_TORCH_INDEX=URL  where torch and torchvision's CPU builds come from on an Ascend host
#                              (default: PyPI's CPU index of PyTorch; a local mirror of it)
#   DANCEGRPO_ASCEND_BASES=DIR[:DIR]
#                              where CANN is installed when ASCEND_HOME_PATH is unset
#                              (default: /usr/local/Ascend:/usr/local/npu)
#   DANCEGRPO_PIP_ARGS="..."   extra pip arguments (e.g. --index-url of a local mirror)
#   DANCEGRPO_SOURCE=URL|DIR|FILE.tar.gz   where to fetch upstream from (see README)
#   DANCEGRPO_DEVICE=auto|cpu|cuda|npu     the device of the smoke run
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${DANCEGRPO_VENV:-$ROOT/.venv}
MODE=all
LAYERS=()
TORCH_LINE=
want=
for arg in "$@"; do
  case "$want" in
    layer) LAYERS+=("$arg"); want=; continue ;;
    torch) TORCH_LINE=$arg; want=; continue ;;
  esac
  case "$arg" in
    --deps-only) MODE=deps ;;
    --no-smoke) MODE=nosmoke ;;
    --print-torch) MODE=print-torch ;;
    --with) want=layer ;;
    --with=*) LAYERS+=("${arg#--with=}") ;;
    --torch) want=torch ;;
    --torch=*) TORCH_LINE=${arg#--torch=} ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bootstrap.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ "$want" = layer ] && { echo "bootstrap.sh: --with needs a dependency set: diffusers-0.35" >&2; exit 2; }
[ "$want" = torch ] && { echo "bootstrap.sh: --torch needs a torch line: 2.10 (the default), 2.7, 2.9 or 2.8" >&2; exit 2; }
for layer in "${LAYERS[@]+"${LAYERS[@]}"}"; do
  [ -f "scripts/deps/$layer.txt" ] ||
    { echo "bootstrap.sh: no dependency set $layer (one of: $(cd scripts/deps && ls | sed 's/\.txt$//' | tr '\n' ' '))" >&2; exit 2; }
done

say() { printf '==> %s\n' "$*"; }
die() { printf 'bootstrap.sh: error: %s\n' "$*" >&2; exit 1; }

# --- 1. Python -----------------------------------------------------------------
is_supported_python() {
  "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3, 10), (3, 11), (3, 12)) else 1)' 2>/dev/null
}
pick_python() {
  local c
  if [ -n "${PYTHON:-}" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON is not an interpreter on this machine"
    is_supported_python "$PYTHON" ||
      die "PYTHON=$PYTHON is not Python 3.10, 3.11 or 3.12 (torch_npu and the pinned stack support those)"
    PICKED_PYTHON=$PYTHON
    return
  fi
  for c in python3.11 python3.12 python3.10 python3; do
    if command -v "$c" >/dev/null 2>&1 && is_supported_python "$c"; then
      PICKED_PYTHON=$c
      return
    fi
  done
  die "no Python 3.10, 3.11 or 3.12 found; install one or set PYTHON=/path/to/python3.11"
}

# --- 2. Which torch pair ---------------------------------------------------------
# A torch/torchvision pair built for each other (PyPI's torchvision does not import beside a
# CPU-only torch); on an Ascend host the torch_npu of the host's CANN by Ascend's table, chosen by
# src/dancegrpo_npu/host/torch_stack.py (run by path: nothing is installed yet).  Upstream's own
# pins (flash-attn, liger_kernel, decord, CUDA wheels) are never installed.
choose_torch() {
  local py=$1 out err
  err=$(mktemp)
  if ! out=$("$py" src/dancegrpo_npu/host/torch_stack.py choose ${TORCH_LINE:+--torch "$TORCH_LINE"} 2>"$err"); then
    printf 'bootstrap.sh: error: %s\n' "$(cat "$err")" >&2
    rm -f "$err"
    exit 2
  fi
  rm -f "$err"
  TORCH_ASCEND=$(sed -n 's/^ascend=//p' <<<"$out")
  TORCH_SPEC=$(sed -n 's/^spec=//p' <<<"$out")
  TORCH_INDEX=${DANCEGRPO_TORCH_INDEX:-$(sed -n 's/^index=//p' <<<"$out")}
  TORCH_WHY=$(sed -n 's/^why=//p' <<<"$out")
  TORCH_WARNING=$(sed -n 's/^warning=//p' <<<"$out")
}

EXTRAS=train,video,test,msprobe
HPSV2_SPEC="hpsv2==1.2.0"
# hpsv2's wheel asks for pytest==7.2.0 and protobuf<4 (and more it never imports);
# install it without them, with the one module it imports that nothing else brings (clint).
HPSV2_NEEDS="clint"

setup_stamp() {
  {
    echo "python=$("$VENV/bin/python" -c 'import sys; print(sys.version)')"
    echo "torch=$TORCH_SPEC index=$TORCH_INDEX"
    echo "extras=$EXTRAS hpsv2=$HPSV2_SPEC needs=$HPSV2_NEEDS"
    sha256sum pyproject.toml
  } | sha256sum | cut -c1-64
}

install_deps() {
  if [ ! -x "$VENV/bin/python" ]; then
    pick_python
    say "creating $VENV with $PICKED_PYTHON"
    "$PICKED_PYTHON" -m venv "$VENV"
  fi
  local stamp_file="$VENV/.dancegrpo-npu-setup" want
  want=$(setup_stamp)
  if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want" ]; then
    say "dependencies up to date ($VENV)"
    return
  fi
  local pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
  # shellcheck disable=SC2086
  {
    say "installing the torch pair: $TORCH_SPEC"
    if [ "$TORCH_ASCEND" = 1 ]; then
      # torch and torchvision from the CPU index (torch_npu refuses a torch that brings CUDA, and
      # PyPI's default torch is a CUDA build on both architectures); torch-npu from the usual index
      local req cpu=() npu=()
      for req in $TORCH_SPEC; do
        case "$req" in torch-npu==*) npu+=("$req") ;; *) cpu+=("$req") ;; esac
      done
      "${pip[@]}" install -q ${DANCEGRPO_PIP_ARGS:-} --index-url "$TORCH_INDEX" "${cpu[@]}"
      "${pip[@]}" install -q ${DANCEGRPO_PIP_ARGS:-} "${npu[@]}"
    else
      "${pip[@]}" install -q ${DANCEGRPO_PIP_ARGS:-} $TORCH_SPEC
    fi
    say "installing dancegrpo-npu[$EXTRAS]"
    "${pip[@]}" install -q ${DANCEGRPO_PIP_ARGS:-} -e ".[$EXTRAS]"
    say "installing $HPSV2_SPEC (without its test-tool pins)"
    "${pip[@]}" install -q ${DANCEGRPO_PIP_ARGS:-} $HPSV2_NEEDS
    "${pip[@]}" install -q ${DANCEGRPO_PIP_ARGS:-} --no-deps "$HPSV2_SPEC"
  } 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  # The hpsv2 wheel lacks the BPE vocabulary its tokenizer opens at import; it is the
  # same file open_clip ships (copied, checked by sha256).
  "$VENV/bin/python" -c 'from dancegrpo_npu.smoke.fixtures import ensure_hpsv2_vocab as e; e()' ||
    die "could not complete hpsv2's installation (see above)"
  # hpsv2's open_clip does `from turtle import forward`, so it needs Tk.
  "$VENV/bin/python" -c 'import tkinter' 2>/dev/null ||
    die "this Python has no Tk, which hpsv2 imports; install python3-tk (Debian/Ubuntu), tk (conda) or tkinter (RHEL), then re-run"
  PYTHONWARNINGS=ignore "$VENV/bin/python" -c 'import torch, torchvision, diffusers, hpsv2.src.open_clip' ||
    die "the installed stack does not import (see above); set DANCEGRPO_TORCH to a matching torch/torchvision pair"
  echo "$want" >"$stamp_file"
}

# --- 3. A dependency set layered on .venv ---------------------------------------------------
# A second virtualenv holding only the set's packages (and what they need newer); a .pth file
# appends the first virtualenv's site-packages to its path, so torch and the rest come from
# there and are not installed twice.  Its own packages come first on sys.path, so they win.
layer_dir() {
  local var="DANCEGRPO_VENV_$(echo "$1" | tr 'a-z.-' 'A-Z__')"
  echo "${!var:-$VENV-$1}"
}
install_layer() {
  local name=$1 dir req stamp_file want base_site
  dir=$(layer_dir "$name")
  req="scripts/deps/$name.txt"
  stamp_file="$dir/.dancegrpo-npu-setup"
  want=$( { setup_stamp; sha256sum "$req"; } | sha256sum | cut -c1-64)
  if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want" ]; then
    say "dependency set $name up to date ($dir)"
    return
  fi
  [ -x "$dir/bin/python" ] || { say "creating $dir (the $name set, layered on $VENV)"; "$VENV/bin/python" -m venv "$dir"; }
  base_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$dir/bin/python" - "$base_site" <<'PY'
import sys, sysconfig, pathlib
site = pathlib.Path(sysconfig.get_paths()["purelib"])
(site / "zz-dancegrpo-base-venv.pth").write_text(f"import site; site.addsitedir({sys.argv[1]!r})\n")
PY
  say "installing the $name set into $dir"
  # pip sees the first virtualenv's packages through the .pth: it installs here only what the
  # set pins or needs newer, and never uninstalls there ("outside environment").
  # shellcheck disable=SC2086
  "$dir/bin/python" -m pip --disable-pip-version-check install -q ${DANCEGRPO_PIP_ARGS:-} -r "$req" 2>&1 |
    grep -v "^hpsv2 \|dependency conflicts\|is ignored: it is neither" >&2 || true
  local pins
  pins=$(grep -v '^#' "$req" | sed 's/==/ /' | awk 'NF {print $1 "=" $2}' | tr '\n' ' ')
  PYTHONWARNINGS=ignore "$dir/bin/python" - $pins <<'PY' || die "the $name set does not import as pinned (see above)"
import importlib.metadata as md, sys
import torch, diffusers, transformers, peft, hpsv2.src.open_clip  # noqa: F401  the layered stack imports
bad = [f"{n} {md.version(n)} (wants {v})" for n, v in (a.split("=") for a in sys.argv[1:]) if md.version(n) != v]
sys.exit(f"not as pinned: {', '.join(bad)}" if bad else 0)
PY
  echo "$want" >"$stamp_file"
}

# the choice needs only the standard library: the virtualenv's Python, or the one that will make it
if [ -x "$VENV/bin/python" ]; then choose_torch "$VENV/bin/python"; else pick_python; choose_torch "$PICKED_PYTHON"; fi
[ "$TORCH_ASCEND" = 1 ] && EXTRAS=train,video,test,msprobe,npu
if [ "$MODE" = print-torch ]; then
  printf '%s\n' "$TORCH_WHY" >&2
  [ -n "$TORCH_WARNING" ] && printf 'bootstrap.sh: warning: %s\n' "$TORCH_WARNING" >&2
  printf '%s\n' "$TORCH_SPEC"
  exit 0
fi

say "dancegrpo-npu bootstrap in $ROOT"
say "torch: $TORCH_WHY"
[ -n "$TORCH_WARNING" ] && printf 'bootstrap.sh: warning: %s\n' "$TORCH_WARNING" >&2
install_deps
for layer in "${LAYERS[@]+"${LAYERS[@]}"}"; do install_layer "$layer"; done
[ "$MODE" = deps ] && exit 0

DG=("$VENV/bin/dancegrpo-npu" -C "$ROOT")
say "fetching upstream at the locked commit"
"${DG[@]}" fetch
say "applying the patch series and the overlay"
"${DG[@]}" apply
"${DG[@]}" verify
[ "$MODE" = nosmoke ] && exit 0

say "running the embedded default: a tiny GRPO smoke run"
"${DG[@]}" smoke --device "${DANCEGRPO_DEVICE:-auto}" --if-needed
