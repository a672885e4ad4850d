#!/usr/bin/env bash
# Builds .venv-robosuite: a separate virtualenv for the robosuite / RoboCasa backend.
#
# robosuite pins numpy<2 and other versions our main environment cannot share, so the
# backend lives in its own interpreter. torch is kept out of it entirely (our env modules
# do not need it): a constraint refuses any attempt to install it.
#
#   bash scripts/install_robosuite_env.sh            # robosuite only
#   PYTHON=python3.11 bash scripts/install_robosuite_env.sh
#
# RoboCasa is not on PyPI; after this script, install it into the same venv by hand:
#   git clone https://github.com/robocasa/robocasa && .venv-robosuite/bin/pip install -e robocasa
#   .venv-robosuite/bin/python -m robocasa.scripts.download_kitchen_assets
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-robosuite"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[rlinf-user] creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
# No torch in this environment, ever: any package that asks for it fails the install.
echo "torch<0" >"$constraints"

source "$ROOT/scripts/pkg_install.sh"  # uv where it can be had, else pip
pip=(pkg_install "$VENV/bin/python" -qq -c "$constraints")  # errors only
"${pip[@]}" "robosuite==1.5.2" "mujoco==3.8.1" gymnasium omegaconf pytest pytest-timeout
"${pip[@]}" --no-deps -e "$ROOT"

if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
  echo "[rlinf-user] torch is installed in $VENV; it must not be" >&2
  exit 1
fi
"$VENV/bin/python" -c "import robosuite, rlinf_user.sims.robosuite; print('[rlinf-user] robosuite', robosuite.__version__, 'ready in $VENV')"
