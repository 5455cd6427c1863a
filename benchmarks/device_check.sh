#!/usr/bin/env bash
# The device check: the tests that exercise the numerical core and a fit, then the headline
# timings of benchmarks/device_check.py, in at most 8 minutes on a GPU (about 5 typically).
# Writes benchmarks/results/device_check.{json,md} (the test outcome is recorded there too).
#
#   bash benchmarks/device_check.sh                 # the full check (run from anywhere)
#   bash benchmarks/device_check.sh --dry [--output PATH.json]
#
# --dry skips the test step (recorded as skipped: the suite runs those tests anyway) and runs
# every timed section at tiny sizes on any machine, written to a temporary file unless
# --output is given; it keeps the script from rotting (benchmarks/tests/test_device_check.py).
# Other arguments go to device_check.py. Each step has its own time limit, so a slow step
# cannot eat the other's time: TESTS_LIMIT seconds for the tests, BENCH_LIMIT for the timings.
# PYTHON picks the interpreter (default: python); TEST_WORKERS the pytest-xdist workers of
# the test step (default 4; 0 runs them in this process): on a machine that compiles every
# program afresh, compilation is most of the tests' time, and workers compile in parallel.
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
TESTS_LIMIT="${TESTS_LIMIT:-150}"
BENCH_LIMIT="${BENCH_LIMIT:-300}"
TEST_WORKERS="${TEST_WORKERS:-4}"
# the numerical core (Gram matrices, conditionals, KL, triangular factors and their derivative
# rules) and the layers with a short fit: where a device's kernels and rounding differ
TEST_FILES=(tests/test_core.py tests/test_triangular.py tests/test_layers.py)

DRY=0
for arg in "$@"; do
    [[ "$arg" == "--dry" ]] && DRY=1
done
COMMAND="bash benchmarks/device_check.sh${*:+ $*}"

tests_args=()
if [[ "$DRY" == 1 ]]; then
    tests_args=(--tests-skipped "skipped: --dry runs no tests (the test suite runs these files)")
else
    workers=()
    [[ "$TEST_WORKERS" != 0 ]] && workers=(-n "$TEST_WORKERS")
    tests_cmd=("$PYTHON" -m pytest -q -x "${workers[@]}" "${TEST_FILES[@]}")
    log="$(mktemp)"
    echo "[device_check] ${tests_cmd[*]} (limit ${TESTS_LIMIT} s)" >&2
    start=$(date +%s)
    # workers share the one GPU: each takes memory as it needs it, not 75% up front
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 10 "$TESTS_LIMIT" "${tests_cmd[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    tests_args=(--tests-rc "$rc" --tests-log "$log" --tests-seconds "$(($(date +%s) - start))"
                --tests-command "${tests_cmd[*]}")
fi

echo "[device_check] $PYTHON benchmarks/device_check.py $* (limit ${BENCH_LIMIT} s)" >&2
timeout -k 10 "$BENCH_LIMIT" "$PYTHON" benchmarks/device_check.py "$@" --command "$COMMAND" "${tests_args[@]}"
bench_rc=$?
[[ -n "${log:-}" ]] && rm -f "$log"
if [[ "$DRY" == 0 && "$rc" != 0 ]]; then
    echo "[device_check] the tests failed (exit $rc); see the result file" >&2
    exit 1
fi
exit "$bench_rc"
