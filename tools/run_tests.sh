#!/usr/bin/env bash
# make test: three pytests side by side.
#   1. The integration suite on the sandbox's cluster a (n0-n2): it brings the sandbox up, provisions it from cold,
#      takes a snapshot of the provisioned rank 0, and takes the sandbox down at the end.
#   2. The modules of CLUSTER_B_MODULES on cluster b (n3-n5: copies of that snapshot, inventory/sandbox-mapped-b.yml),
#      once the snapshot is there. Those modules run on whichever cluster they are given; none of them reads what
#      the session's own site.yml runs returned, nor counts the hub's requests or switches the topology (two of
#      them need no node at all: they are there to even out the two clusters' time).
#   3. The suite that needs no sandbox (unit, lint, sanity, readiness's own tests), once the cold site.yml is over:
#      the cold build keeps both cores busy compiling (one run with that suite started beside it was no shorter:
#      34 min 54 s); after it, each integration suite mostly waits on SSH round trips, timeouts and shaped links,
#      and leaves time idle.
# Output: the first on the terminal, the others in artifacts/test-cluster-b.log and artifacts/test-offline.log
# (their summaries, or all of it when one failed, printed at the end); per-test seconds in artifacts/junit-*.xml.
# Arguments go to every pytest. Exit status: 0 when all three passed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
CLUSTER_B_MODULES="test_serve.py test_sweep.py test_stall.py test_readiness_sandbox.py test_locks.py test_bench_failures.py test_glows_rental_sandbox.py test_preflight_playbooks.py test_link_namespaced.py"
mkdir -p artifacts
offline_log=artifacts/test-offline.log
cluster_b_log=artifacts/test-cluster-b.log
cold_build_done=artifacts/.cold-build-done
snapshot_done=artifacts/.snapshot-done
cluster_b_done=artifacts/.cluster-b-done
rm -f "$cold_build_done" "$snapshot_done" "$cluster_b_done"
ignore_b=()
for module in $CLUSTER_B_MODULES; do ignore_b+=("--ignore=tests/integration/$module"); done

PRIMA_TEST_COLD_BUILD_DONE=$PWD/$cold_build_done PRIMA_TEST_SNAPSHOT_DONE=$PWD/$snapshot_done \
PRIMA_TEST_WAIT_BEFORE_DOWN=$PWD/$cluster_b_done \
  "$BIN/pytest" tests/integration "${ignore_b[@]}" --durations=15 --junitxml=artifacts/junit-sandbox.xml "$@" &
sandbox=$!
(
  # Cluster a's nodes go down with its session, which waits for $cluster_b_done first: leave it however this ends.
  trap 'touch "$cluster_b_done"' EXIT
  while [ ! -e "$snapshot_done" ] && kill -0 "$sandbox" 2>/dev/null; do sleep 2; done
  if ! grep -qx copied "$snapshot_done" 2>/dev/null; then
    echo "cluster b did not start: the session on cluster a ended or failed before its snapshot of a provisioned" \
      "node (see its output). To run part of the suite on one cluster, run pytest tests/integration/... directly."
    exit 1
  fi
  modules=()
  for module in $CLUSTER_B_MODULES; do modules+=("tests/integration/$module"); done
  PRIMA_TEST_CLUSTER=b "$BIN/pytest" "${modules[@]}" -p no:cacheprovider --durations=15 \
    --junitxml=artifacts/junit-sandbox-b.xml "$@" &
  pytest_b=$!
  trap 'kill "$pytest_b" 2>/dev/null' TERM INT
  wait "$pytest_b"
  rc=$?
  # A trapped signal ends the first wait early: wait for pytest itself to end.
  wait "$pytest_b" 2>/dev/null
  exit "$rc"
) >"$cluster_b_log" 2>&1 &
cluster_b=$!
(
  while [ ! -e "$cold_build_done" ] && kill -0 "$sandbox" 2>/dev/null; do sleep 2; done
  exec "$BIN/pytest" tests --ignore=tests/integration -p no:cacheprovider --durations=15 \
    --junitxml=artifacts/junit-offline.xml "$@" >"$offline_log" 2>&1
) &
offline=$!
# An interrupted make test takes every pytest with it.
trap 'kill "$sandbox" "$cluster_b" "$offline" 2>/dev/null' EXIT
wait "$sandbox"
sandbox_rc=$?
wait "$cluster_b"
cluster_b_rc=$?
wait "$offline"
offline_rc=$?
trap - EXIT
for part in "cluster b ($CLUSTER_B_MODULES):$cluster_b_log:$cluster_b_rc" \
            "the suite without the sandbox (unit, lint, sanity, readiness):$offline_log:$offline_rc"; do
  IFS=: read -r title log rc <<<"$part"
  echo
  echo "== $title, from $log =="
  if [ "$rc" -eq 0 ]; then tail -n 20 "$log"; else cat "$log"; fi
done
echo
echo "integration suite on cluster a: exit $sandbox_rc; on cluster b: exit $cluster_b_rc;" \
  "the suite without the sandbox: exit $offline_rc"
# pytest's 5 (nothing collected) counts as a failure too: each part must run something.
[ "$sandbox_rc" -eq 0 ] && [ "$cluster_b_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ]
