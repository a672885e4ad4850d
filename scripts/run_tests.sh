#!/usr/bin/env bash
# The test suite in two lanes that run side by side:
#   * tests marked `wallclock` (a robot paced by its control loop behind an emulated
#     link: mostly waiting, little CPU), one after another;
#   * everything else (CPU-bound), one after another.
# TEST_MARK selects tests in both lanes (default: everything but hardware and GPU tests);
# arguments go to both pytest runs. The exit status is the first failing lane's.
set -uo pipefail
cd "$(dirname "$0")/.."
MARK="${TEST_MARK:-not hardware and not gpu}"
LOG="$(mktemp -t wallclock-tests.XXXXXX)"
.venv/bin/python -m pytest -m "wallclock and ($MARK)" -p no:cacheprovider "$@" >"$LOG" 2>&1 &
LANE=$!
.venv/bin/python -m pytest -m "not wallclock and ($MARK)" "$@"
RC_MAIN=$?
wait "$LANE"
RC_WALL=$?
echo "---------------- wallclock lane (paced robot, emulated link) ----------------"
cat "$LOG"
rm -f "$LOG"
# pytest exits 5 when a lane selected nothing: not a failure
[ "$RC_MAIN" -eq 5 ] && RC_MAIN=0
[ "$RC_WALL" -eq 5 ] && RC_WALL=0
[ "$RC_MAIN" -ne 0 ] && exit "$RC_MAIN"
exit "$RC_WALL"
