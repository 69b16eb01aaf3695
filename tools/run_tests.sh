#!/usr/bin/env bash
# make test: four pytests side by side.
#   1. The integration suite on the sandbox's cluster a (n0-n2): it brings the sandbox up, provisions it from cold,
#      takes a snapshot of the provisioned rank 0, and takes the sandbox down at the end. test_site.py first: its
#      session fixture is that provisioning, which the other clusters wait for.
#   2. and 3. The modules of CLUSTER_B_MODULES on cluster b (n3-n5, inventory/sandbox-mapped-b.yml) and those of
#      CLUSTER_C_MODULES on cluster c (n6-n8, inventory/sandbox-mapped-c.yml): copies of that snapshot, once it is
#      there. Those modules run on whichever cluster they are given; none of them reads what the session's own
#      site.yml runs returned, nor counts the hub's requests or switches the topology (two of them need no node
#      at all: they are there to even out the clusters' time).
#   4. The suite that needs no sandbox (unit, lint, sanity, readiness's own tests), once the cold site.yml is over:
#      the cold build keeps both cores busy compiling (one run with that suite started beside it was no shorter:
#      34 min 54 s); after it, each integration suite mostly waits on SSH round trips, timeouts and shaped links,
#      and leaves time idle.
# Output: the first on the terminal, the others in artifacts/test-cluster-b.log, test-cluster-c.log and
# test-offline.log (their summaries, or all of it when one failed, printed at the end); per-test seconds in
# artifacts/junit-*.xml. Arguments go to every pytest. Exit status: 0 when all four passed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
CLUSTER_B_MODULES="test_serve.py test_sweep.py test_stall.py test_readiness_sandbox.py test_locks.py test_bench_failures.py test_preflight_playbooks.py test_link_namespaced.py"
# The session's bench of both modes (conftest.both_modes_bench) and the modules that read it, and the rental.
CLUSTER_C_MODULES="test_bench.py test_bench_overhead.py test_bench_server.py test_installed_bench.py test_glows_rental_sandbox.py"
mkdir -p artifacts
offline_log=artifacts/test-offline.log
cold_build_done=artifacts/.cold-build-done
snapshot_done=artifacts/.snapshot-done
rm -f "$cold_build_done" "$snapshot_done" artifacts/.cluster-[bc]-done
modules_a=(tests/integration/test_site.py)
for path in tests/integration/test_*.py; do
  module=${path##*/}
  case " test_site.py $CLUSTER_B_MODULES $CLUSTER_C_MODULES " in
    *" $module "*) ;;
    *) modules_a+=("$path") ;;
  esac
done

PRIMA_TEST_COLD_BUILD_DONE=$PWD/$cold_build_done PRIMA_TEST_SNAPSHOT_DONE=$PWD/$snapshot_done \
PRIMA_TEST_WAIT_BEFORE_DOWN=$PWD/artifacts/.cluster-b-done:$PWD/artifacts/.cluster-c-done \
  "$BIN/pytest" "${modules_a[@]}" --durations=15 --junitxml=artifacts/junit-sandbox.xml "$@" &
sandbox=$!

# A cluster of copies (b or c) and its modules: its pytest starts once cluster a's snapshot is there.
copies_cluster() {
  local name=$1 module_names=$2
  shift 2
  # Cluster a's nodes go down with its session, which waits for this cluster's done file first: leave it however
  # this ends.
  trap "touch 'artifacts/.cluster-$name-done'" EXIT
  while [ ! -e "$snapshot_done" ] && kill -0 "$sandbox" 2>/dev/null; do sleep 2; done
  if ! grep -qx copied "$snapshot_done" 2>/dev/null; then
    echo "cluster $name did not start: the session on cluster a ended or failed before its snapshot of a" \
      "provisioned node (see its output). To run part of the suite on one cluster, run pytest" \
      "tests/integration/... directly."
    exit 1
  fi
  local modules=() module
  for module in $module_names; do modules+=("tests/integration/$module"); done
  PRIMA_TEST_CLUSTER=$name "$BIN/pytest" "${modules[@]}" -p no:cacheprovider --durations=15 \
    --junitxml="artifacts/junit-sandbox-$name.xml" "$@" &
  local pytest_pid=$!
  trap 'kill "$pytest_pid" 2>/dev/null' TERM INT
  wait "$pytest_pid"
  local rc=$?
  # A trapped signal ends the first wait early: wait for pytest itself to end.
  wait "$pytest_pid" 2>/dev/null
  exit "$rc"
}
(copies_cluster b "$CLUSTER_B_MODULES" "$@") >artifacts/test-cluster-b.log 2>&1 &
cluster_b=$!
(copies_cluster c "$CLUSTER_C_MODULES" "$@") >artifacts/test-cluster-c.log 2>&1 &
cluster_c=$!
(
  while [ ! -e "$cold_build_done" ] && kill -0 "$sandbox" 2>/dev/null; do sleep 2; done
  exec "$BIN/pytest" tests --ignore=tests/integration -p no:cacheprovider --durations=15 \
    --junitxml=artifacts/junit-offline.xml "$@" >"$offline_log" 2>&1
) &
offline=$!
# An interrupted make test takes every pytest with it.
trap 'kill "$sandbox" "$cluster_b" "$cluster_c" "$offline" 2>/dev/null' EXIT
wait "$sandbox"
sandbox_rc=$?
wait "$cluster_b"
cluster_b_rc=$?
wait "$cluster_c"
cluster_c_rc=$?
wait "$offline"
offline_rc=$?
trap - EXIT
for part in "cluster b ($CLUSTER_B_MODULES):artifacts/test-cluster-b.log:$cluster_b_rc" \
            "cluster c ($CLUSTER_C_MODULES):artifacts/test-cluster-c.log:$cluster_c_rc" \
            "the suite without the sandbox (unit, lint, sanity, readiness):$offline_log:$offline_rc"; do
  IFS=: read -r title log rc <<<"$part"
  echo
  echo "== $title, from $log =="
  if [ "$rc" -eq 0 ]; then tail -n 20 "$log"; else cat "$log"; fi
done
echo
echo "integration suite on cluster a: exit $sandbox_rc; on cluster b: exit $cluster_b_rc; on cluster c:" \
  "exit $cluster_c_rc; the suite without the sandbox: exit $offline_rc"
# pytest's 5 (nothing collected) counts as a failure too: each part must run something.
[ "$sandbox_rc" -eq 0 ] && [ "$cluster_b_rc" -eq 0 ] && [ "$cluster_c_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ]
