"""Across the cluster: every rank reaches the ports it will connect to, every rank runs the same
build and has the same weights. The same code as bench.yml's preflight: launch_plans,
bench_probe_spec, bench_agreement_problems and the ring_probe module.
"""

import json
import threading

from bench import agreement_problems, probe_spec
from launch import GIB, launch_plans
from models import merged_catalog, models_selection


def plans_for(cluster):
    """The units bench.yml would run on these nodes, for the first selected model."""
    first = cluster[0]
    catalog = merged_catalog(first.var("models_catalog", {}), first.var("models_extra_catalog", {}))
    models = models_selection(first.var("model"), first.var("models_enabled", []), catalog)[:1]
    runtimes = (["prima"] if first.var("prima_enabled", True) else []) + ["llama_rpc", "single"]
    # Ports and addresses are what matter here; memory only sizes the layer window.
    nodes = [{"host": item.name, "address": str(item.var("cluster_ip")), "cores": 1,
              "memory": {"ram": 64 * GIB, "vram": 0, "total": 64 * GIB}} for item in cluster]
    options = {"models_dir": first.var("models_dir", "/opt/models"), "state_dir": "/var/lib/prima-bench",
               "prima_cli": "llama-cli", "completion": "llama-completion", "rpc_server": "ggml-rpc-server",
               "rpc_port": int(first.var("launch_rpc_port", 50052)), "layer_window": "auto",
               "data_port_base": int(first.var("launch_data_port_base", 9000)),
               "signal_port_base": int(first.var("launch_signal_port_base", 10000)), "threads": 1, "prompt": "",
               "n_predict": 1, "ctx_size": 1, "seed": 0}
    return list(launch_plans(nodes, runtimes, models, catalog, options).values()), catalog


def test_ranks_reach_each_other(cluster):
    plans, _ = plans_for(cluster)
    results = {}

    def probe(item):
        spec = probe_spec(plans, item.name)
        args = json.dumps({"address": str(item.var("cluster_ip")), "ports": spec["ports"],
                           "targets": spec["targets"], "expect": spec["expect"], "timeout_s": 15})
        try:
            results[item.name] = item.host.ansible("ring_probe", args, check=False)
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


def test_same_build_and_weights(cluster):
    plans, catalog = plans_for(cluster)
    hostvars = {item.name: {"ansible_local": item.facts} for item in cluster}
    problems = agreement_problems(plans, hostvars, catalog)
    assert not problems, "; ".join(problems)
