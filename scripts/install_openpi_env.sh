#!/usr/bin/env bash
# Builds .openpi-pkgs: openpi's client package (openpi-client, with its msgpack_numpy codec)
# in an isolated package folder, used by the tests' openpi-style policy server
# (tests/oracles/openpi_server.py) as an independent encoder of the wire format.
#
# openpi-client 0.1.2 pins numpy<2, which cannot share rlinf-user's environment, so it and
# that numpy go into a folder only the server's interpreter puts first on its path;
# msgpack and websockets come from .venv.
#
#   bash scripts/install_openpi_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="$ROOT/.openpi-pkgs"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PINS=("openpi-client==0.1.2" "numpy==1.26.4")
STAMP="$TARGET/.installed"
want="$(printf '%s\n' "${PINS[@]}")"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[rlinf-user] openpi client packages ready in $TARGET"
  exit 0
fi
rm -rf "$TARGET"
source "$ROOT/scripts/pkg_install.sh"  # uv where it can be had, else pip
pkg_install "$PYTHON" -q --no-deps --target "$TARGET" "${PINS[@]}"
printf '%s\n' "${PINS[@]}" >"$STAMP"
echo "[rlinf-user] openpi client packages installed in $TARGET"
