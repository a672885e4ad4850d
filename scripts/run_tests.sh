#!/usr/bin/env bash
# The test suite in two lanes that run side by side:
#   * tests marked `wallclock` (a robot paced by its control loop behind an emulated
#     link: mostly waiting, little CPU), one after another, then the CPU-bound tests named
#     in TAIL (none of them paced or timed: unit tests, in-process HG-DAgger, the CLI), so
#     that both lanes end at about the same time;
#   * every other test (CPU-bound), one after another.
# The side environments (robosuite's virtualenv, LeRobot's and openpi's client packages) install in the
# background meanwhile (SIDE_ENVS=0: not at all); the tests that use them run last in their
# lane and wait for the install to finish (tests/integration/side_envs.py).
# TEST_MARK selects tests in both lanes (default: everything but hardware and GPU tests);
# arguments are pytest options for every run (the lanes choose their own files: a test path
# is refused; run `.venv/bin/python -m pytest <path>` for one file). The exit status is the
# first failing lane's.
set -uo pipefail
cd "$(dirname "$0")/.."
for a in "$@"; do
  if [[ "$a" != -* && -e "$a" ]]; then
    echo "run_tests.sh takes pytest options, not test paths ('$a'): each lane selects its own files;" \
      "for one file run: .venv/bin/python -m pytest $a" >&2
    exit 2
  fi
done
# test modules are imported by basename (no packages under tests/): two files of one name
# would fail collection only when a lane reaches the second, so refuse them up front
DUPS="$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d)"
if [ -n "$DUPS" ]; then
  echo "test files must have distinct names; these appear twice: $DUPS" >&2
  exit 2
fi
MARK="${TEST_MARK:-not hardware and not gpu}"
LOG="$(mktemp -t wallclock-tests.XXXXXX)"
if [ "${SIDE_ENVS:-1}" = 1 ]; then
  mkdir -p .side-envs
  rm -f .side-envs/status
  (
    { bash scripts/install_robosuite_env.sh && bash scripts/install_lerobot_env.sh && bash scripts/install_openpi_env.sh; } >.side-envs/install.log 2>&1
    echo $? >.side-envs/status
    rm -f .side-envs/installing
  ) &
  SIDE=$!
  echo "$SIDE" >.side-envs/installing  # a stale id (the install already done) names no live process
fi
# the second lane's CPU-bound part (balanced by the CPU-seconds each test costs:
# RLINF_TEST_CPU, docs/testing.md)
TAIL=(tests/unit tests/integration/test_hg_dagger.py tests/integration/test_cli.py tests/integration/test_demos_training.py
      tests/integration/test_soak.py tests/integration/test_openpi_server.py tests/integration/test_dsrl_learning.py
      tests/integration/test_cluster.py tests/integration/test_elastic.py tests/integration/test_plan_cluster.py)
IGNORE=()
for t in "${TAIL[@]}"; do IGNORE+=("--ignore=$t"); done
# only the files that hold wallclock tests are collected for them (collecting the whole
# suite imports every simulator: about a CPU-minute)
mapfile -t WALL_FILES < <(grep -rl --include='test_*.py' "mark.wallclock" tests | sort)
[ "${#WALL_FILES[@]}" -eq 0 ] && WALL_FILES=(tests)
(
  .venv/bin/python -m pytest -m "wallclock and ($MARK)" -p no:cacheprovider "${WALL_FILES[@]}" "$@"
  rc=$?
  [ "$rc" -eq 5 ] && rc=0
  .venv/bin/python -m pytest -m "not wallclock and ($MARK)" -p no:cacheprovider "${TAIL[@]}" "$@"
  rc2=$?
  [ "$rc2" -eq 5 ] && rc2=0
  [ "$rc" -ne 0 ] && exit "$rc"
  exit "$rc2"
) >"$LOG" 2>&1 &
LANE=$!
.venv/bin/python -m pytest -m "not wallclock and ($MARK)" "${IGNORE[@]}" "$@"
RC_MAIN=$?
wait "$LANE"
RC_WALL=$?
[ -n "${SIDE:-}" ] && wait "$SIDE"
echo "---------------- second lane: paced robot and emulated link, then ${TAIL[*]} ----------------"
cat "$LOG"
rm -f "$LOG"
# pytest exits 5 when a lane selected nothing: not a failure
[ "$RC_MAIN" -eq 5 ] && RC_MAIN=0
[ "$RC_WALL" -eq 5 ] && RC_WALL=0
[ "$RC_MAIN" -ne 0 ] && exit "$RC_MAIN"
exit "$RC_WALL"
