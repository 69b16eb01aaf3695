#!/usr/bin/env bash
# make test: the suite that needs no sandbox (unit, lint, sanity, readiness's own tests) runs beside the
# integration suite on the sandbox, each in a pytest of its own; the first mostly waits on nothing, the second
# mostly on SSH round trips, so the two share this machine's cores instead of taking turns.
# Output: the integration suite on the terminal, the other in artifacts/test-offline.log (its summary, or all
# of it when it failed, printed at the end); per-test seconds of both in artifacts/junit-*.xml.
# Arguments go to both pytests. Exit status: 0 when both passed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
mkdir -p artifacts
offline_log=artifacts/test-offline.log
"$BIN/pytest" tests --ignore=tests/integration -p no:cacheprovider --durations=15 \
  --junitxml=artifacts/junit-offline.xml "$@" >"$offline_log" 2>&1 &
offline=$!
# An interrupted make test takes the other pytest with it.
trap 'kill "$offline" 2>/dev/null' EXIT
"$BIN/pytest" tests/integration --durations=15 --junitxml=artifacts/junit-sandbox.xml "$@"
sandbox_rc=$?
wait "$offline"
offline_rc=$?
trap - EXIT
echo
echo "== the suite without the sandbox (unit, lint, sanity, readiness), from $offline_log =="
if [ "$offline_rc" -eq 0 ]; then tail -n 20 "$offline_log"; else cat "$offline_log"; fi
echo
echo "integration suite: exit $sandbox_rc; the suite without the sandbox: exit $offline_rc"
# pytest's 5 (nothing collected) counts as a failure too: each half must run something.
[ "$sandbox_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ]
