#!/usr/bin/env bash
# make test: the suite that needs no sandbox (unit, lint, sanity, readiness's own tests) runs beside the
# integration suite on the sandbox, each in a pytest of its own. The first starts once the integration suite's
# cold site.yml is over (or that suite has ended): the cold build keeps both cores busy compiling, while the
# integration suite after it mostly waits on SSH round trips and leaves a core's worth of time idle.
# Output: the integration suite on the terminal, the other in artifacts/test-offline.log (its summary, or all
# of it when it failed, printed at the end); per-test seconds of both in artifacts/junit-*.xml.
# Arguments go to both pytests. Exit status: 0 when both passed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
mkdir -p artifacts
offline_log=artifacts/test-offline.log
cold_build_done=artifacts/.cold-build-done
rm -f "$cold_build_done"
PRIMA_TEST_COLD_BUILD_DONE=$PWD/$cold_build_done \
  "$BIN/pytest" tests/integration --durations=15 --junitxml=artifacts/junit-sandbox.xml "$@" &
sandbox=$!
(
  while [ ! -e "$cold_build_done" ] && kill -0 "$sandbox" 2>/dev/null; do sleep 2; done
  exec "$BIN/pytest" tests --ignore=tests/integration -p no:cacheprovider --durations=15 \
    --junitxml=artifacts/junit-offline.xml "$@" >"$offline_log" 2>&1
) &
offline=$!
# An interrupted make test takes both pytests with it.
trap 'kill "$sandbox" "$offline" 2>/dev/null' EXIT
wait "$sandbox"
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
