#!/usr/bin/env bash
# Builds .lerobot-pkgs: LeRobot's own dataset code in an isolated package folder, used by
# the tests as an independent reader of the datasets rlinf-user writes.
#
# lerobot 0.4.x pins torch<2.11 and a matching torchvision/torchcodec, which cannot share
# rlinf-user's environment (and would pull a CUDA torch). Here its dataset stack is
# installed without dependency resolution into a folder that only the oracle subprocess
# puts first on its path; everything else (torch, numpy, requests, ...) comes from .venv.
#
#   bash scripts/install_lerobot_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="$ROOT/.lerobot-pkgs"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PINS=(
  "lerobot==0.4.4" "datasets==4.8.5" "huggingface-hub==0.35.3" "torchvision==0.25.0" "av==15.1.0"
  "pandas==3.1.1" "pyarrow==26.0.1" "accelerate==1.15.0" "safetensors==0.8.0" "draccus==0.10.0"
  "dill==0.4.1" "multiprocess==0.70.19" "xxhash==4.1.0" "httpx==0.28.1" "jsonlines==4.0.0"
  "einops==0.8.2" "deepdiff==9.1.0" "orderly-set==5.5.0" "termcolor==3.3.0" "mergedeep==1.3.4"
  "pyyaml-include==2.2" "typing-inspect==0.9.0" "mypy-extensions==1.2.0" "toml==0.10.2"
)
STAMP="$TARGET/.installed"
want="$(printf '%s\n' "${PINS[@]}")"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[rlinf-user] LeRobot oracle packages ready in $TARGET"
  exit 0
fi
rm -rf "$TARGET"
source "$ROOT/scripts/pkg_install.sh"  # uv where it can be had, else pip
pkg_install "$PYTHON" -q --no-deps --target "$TARGET" "${PINS[@]}"
printf '%s\n' "${PINS[@]}" >"$STAMP"
echo "[rlinf-user] LeRobot oracle packages installed in $TARGET"
