#!/usr/bin/env bash
# One-step set-up on a fresh Linux machine: system pieces, a virtualenv in .venv, the
# right torch build for this machine (CPU build where no NVIDIA GPU is present, CUDA build
# where one is), then rlinf-user with its simulator and test extras.
#
#   bash scripts/install.sh            # default extras: sim,test
#   EXTRAS=sim,franka-sim,realsense,teleop,test bash scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS="${EXTRAS:-sim,franka-sim,realsense,teleop,test}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

bash scripts/install_system_deps.sh

if [ ! -x .venv/bin/python ]; then
  echo "[rlinf-user] creating .venv"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q)

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

installed_torch=$(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if has_gpu; then
  if [ -z "$installed_torch" ] || [[ "$installed_torch" == *+cpu* ]]; then
    echo "[rlinf-user] NVIDIA GPU found: installing the CUDA build of torch==$TORCH_VERSION"
    "${PIP[@]}" "torch==$TORCH_VERSION"
  fi
else
  if [ -z "$installed_torch" ]; then
    # Never let a CPU machine pull the multi-GB CUDA build: use a CPU wheel that pip's own
    # configuration already offers (find-links), else PyTorch's CPU index.
    local_cpu=""
    for dir in $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
      dir="${dir#file://}"
      if ls "$dir"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1; then local_cpu=1; fi
    done
    if [ -n "$local_cpu" ]; then
      echo "[rlinf-user] no GPU: installing the CPU build torch==$TORCH_VERSION (local wheel)"
      "${PIP[@]}" "torch==$TORCH_VERSION"
    else
      echo "[rlinf-user] no GPU: installing the CPU build torch==$TORCH_VERSION from PyTorch's CPU index"
      "${PIP[@]}" "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi

# Pin whatever torch is now installed so no dependency can swap it for another build.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
.venv/bin/python -c 'import torch; print("torch==" + torch.__version__)' > "$constraints"
echo "[rlinf-user] installing rlinf-user[$EXTRAS] (torch pinned: $(cat "$constraints"))"
"${PIP[@]}" -c "$constraints" -e ".[$EXTRAS]"
echo "[rlinf-user] done: $(.venv/bin/rlinf-user --help >/dev/null && echo 'rlinf-user ready in .venv/bin')"
