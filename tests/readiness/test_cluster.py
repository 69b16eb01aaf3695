"""Across the cluster: every rank reaches the ports it will connect to, every rank runs the same
build and has the same weights. The same code as bench.yml's preflight: launch_plans,
bench_probe_spec, bench_agreement_problems and the ring_probe module.
"""

import json
import shlex
import threading

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.checks import agreement_problems, probe_spec


def forwarders(cluster, command):
    """Through SSH the ranks reach each other only through the forwarders: start or stop them on every node."""
    results = {}

    def run(item):
        script = (item.facts.get("transport") or {}).get("script", "")
        argv = [script, "up", "rank", "30"] if command == "up" else [script, "down"]
        results[item.name] = item.host.run(" ".join(shlex.quote(arg) for arg in argv))

    threads = [threading.Thread(target=run, args=(item,)) for item in cluster]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ["%s: %s" % (name, (result.stdout + result.stderr).strip()) for name, result in sorted(results.items())
            if result.rc != 0]


def test_ranks_reach_each_other(cluster, cluster_plans, transport):
    plans, dummy = cluster_plans
    through_ssh = transport["mode"] == "ssh"
    if through_ssh:
        problems = forwarders(cluster, "up")
        if problems:
            forwarders(cluster, "down")
            raise AssertionError("the SSH forwarders did not come up: " + "; ".join(problems))
    try:
        reach(cluster, plans)
    finally:
        if through_ssh:
            forwarders(cluster, "down")


def reach(cluster, plans):
    results = {}

    def probe(item):
        spec = probe_spec(plans, item.name)
        args = json.dumps({"address": spec["bind"] or str(item.var("cluster_ip")), "ports": spec["ports"],
                           "targets": spec["targets"], "expect": spec["expect"], "timeout_s": 15,
                           # A ping and a payload: through an SSH forward a bare connect ends on this node.
                           "payload_bytes": 1048576})
        try:
            results[item.name] = item.host.ansible("prima.cluster.ring_probe", args, check=False)
        except Exception as error:  # an unreachable node: say so, keep probing the others
            results[item.name] = {"failed": True, "msg": str(error).splitlines()[0]}

    threads = [threading.Thread(target=probe, args=(item,)) for item in cluster]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # testinfra drops `failed` from a module's result: a probe that ran to the end reports rtt_ms.
    problems = ["%s: %s" % (name, result.get("msg")) for name, result in sorted(results.items())
                if "rtt_ms" not in result or result.get("unreached")]
    missing = ["%s: nobody reached port(s) %s" % (name, result["missing_peers"]) for name, result in
               sorted(results.items()) if result.get("missing_peers")]
    assert not problems + missing, "; ".join(problems + missing)


def test_same_build_and_weights(cluster, cluster_plans):
    plans, catalog = cluster_plans
    hostvars = {item.name: {"ansible_local": item.facts} for item in cluster}
    problems = agreement_problems(plans, hostvars, catalog)
    assert not problems, "; ".join(problems)
