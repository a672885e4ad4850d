#!/usr/bin/env bash
# System pieces rlinf-user needs on a Debian/Ubuntu host:
#   * libvulkan1 (the Vulkan loader) and libusb-1.0-0 (pyrealsense2) from apt;
#   * on machines without a GPU driver, a private copy of Mesa's lavapipe (software Vulkan)
#     new enough for SAPIEN/ManiSkill (Mesa >= 24), unpacked into $RLINF_USER_DEPS/mesa
#     without touching the system's Mesa. rlinf_user.sims.vulkan points the Vulkan
#     loader at it at run time.
set -euo pipefail

DEPS="${RLINF_USER_DEPS:-$HOME/.cache/rlinf-user}"
MESA_DIR="$DEPS/mesa"
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need_apt=()
for pkg in libvulkan1 libusb-1.0-0 libegl1 libgl1 ffmpeg; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  echo "[rlinf-user] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[rlinf-user] NVIDIA GPU found: using the system Vulkan driver"
  exit 0
fi

if ls "$MESA_DIR"/usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  echo "[rlinf-user] software Vulkan (lavapipe) already in $MESA_DIR"
  exit 0
fi

. /etc/os-release
if [ "${VERSION_CODENAME:-}" != "bookworm" ]; then
  # Newer distributions ship a lavapipe that is new enough.
  echo "[rlinf-user] installing the distribution's mesa-vulkan-drivers"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers >/dev/null
  exit 0
fi

echo "[rlinf-user] fetching Mesa 25 lavapipe from bookworm-backports into $MESA_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
cat > "$work/sources.list" <<SRC
deb http://deb.debian.org/debian bookworm-backports main
deb http://deb.debian.org/debian bookworm main
SRC
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=-"
      -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "Debug::NoLocking=1")
apt-get "${opts[@]}" -o APT::Sandbox::User=root update -qq
(cd "$work/debs" && apt-get "${opts[@]}" -o APT::Sandbox::User=root download \
   mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports \
   libdrm-amdgpu1/bookworm-backports libllvm19 libz3-4 >/dev/null)
mkdir -p "$MESA_DIR"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$MESA_DIR"; done
# Make the ICD's library path absolute so the loader finds the private copy.
for icd in "$MESA_DIR"/usr/share/vulkan/icd.d/lvp_icd*.json; do
  lib=$(ls "$MESA_DIR"/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so)
  sed -i "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$lib\"#" "$icd"
done
echo "[rlinf-user] lavapipe ready: $(ls "$MESA_DIR"/usr/share/vulkan/icd.d/lvp_icd*.json)"
