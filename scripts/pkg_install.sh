# Sourced by the install scripts: `pkg_install PYTHON ARGS...` installs into PYTHON's
# environment with uv (a pip replacement written in Rust: the full install resolves the same
# versions as pip in 14 s instead of about 2 min of CPU) where uv can be had, else with pip.
#
# uv reads no pip configuration, so the package sources pip is configured with (pip.conf,
# PIP_* variables: index-url, extra-index-url, find-links, constraint, cert, timeout) are
# handed to uv as flags, and uv picks the best version across all of them as pip does.
# RLINF_INSTALLER=pip forces pip. Arguments are pip's: -c FILE, -e PATH, --no-deps,
# --target DIR, --extra-index-url URL, wheel files and requirements.

_uv_bin=""
_uv_args=()

# uv for the environment of python $1 (installed into it by pip when missing); 1 when unusable
_uv_ready() {
  local py="$1" dir
  [ "${RLINF_INSTALLER:-uv}" = "uv" ] || return 1
  dir="$(dirname "$py")"
  if [ ! -x "$dir/uv" ]; then
    "$py" -m pip install -qq uv >/dev/null 2>&1 || return 1
  fi
  [ -x "$dir/uv" ] || return 1
  _uv_bin="$dir/uv"
  _uv_args=(--index-strategy unsafe-best-match)
  local key value v seen=" "
  while IFS= read -r line; do
    key="${line%%=*}"
    key="${key##*.}"
    value="${line#*=}"
    value="${value#\'}"
    value="${value%\'}"
    for v in $value; do
      case "$seen" in *" $key=$v "*) continue ;; esac  # pip lists a setting once per source
      seen+="$key=$v "
      case "$key" in
        index-url) _uv_args+=(--index-url "$v") ;;
        extra-index-url) _uv_args+=(--extra-index-url "$v") ;;
        find-links) _uv_args+=(--find-links "$v") ;;
        constraint) [ -f "$v" ] && _uv_args+=(--constraint "$v") ;;
        cert) export SSL_CERT_FILE="${SSL_CERT_FILE:-$v}" ;;
        timeout | default-timeout) export UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-$v}" ;;
      esac
    done
  done < <("$py" -m pip config list 2>/dev/null)
  export UV_LINK_MODE="${UV_LINK_MODE:-copy}"  # the cache may sit on another filesystem
  return 0
}

pkg_install() {
  local py="$1"
  shift
  if [ -z "$_uv_bin" ] && ! _uv_ready "$py"; then
    "$py" -m pip install -qq "$@"
    return
  fi
  local args=() a
  for a in "$@"; do
    case "$a" in
      -q | -qq) ;;  # uv is told -q below
      *) args+=("$a") ;;
    esac
  done
  # --compile-bytecode: pip writes every module's .pyc at install and uv does not; where
  # PYTHONDONTWRITEBYTECODE is set nothing writes them later, and every process (each Ray
  # actor, each CLI call) compiled torch and the rest from source: a full test run took 46
  # minutes instead of 28
  if ! "$_uv_bin" pip install -q --compile-bytecode --python "$py" "${_uv_args[@]}" "${args[@]}"; then
    echo "[rlinf-user] uv could not install ${args[*]}; trying pip" >&2
    "$py" -m pip install -qq "$@"
  fi
}
