"""bench.yml's cross-rank checks: same builds, same weights, probe targets, rank reports."""

import json

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.checks import (
    agreement_problems, link_shaping, probe_payload_bytes, probe_spec, rank_reports)
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import GIB, LaunchOptions, launch_plans

CATALOG = {"tiny": {"n_layer": 8, "files": [{"name": "tiny.gguf", "size": 8000}]}}
OPTIONS = LaunchOptions.from_mapping({
    "models_dir": "/opt/models", "state_dir": "/s", "prima_cli": "cli", "llama_cpp_bin": "/bin", "rpc_port": 50052,
    "layer_window": "auto", "prefetch": False, "data_port_base": 9000, "signal_port_base": 10000, "threads": 1,
    "prompt": "p", "n_predict": 8, "ctx_size": 64, "seed": 1})
NODES = [{"host": "n%d" % rank, "address": "10.0.0.%d" % rank, "cores": 2,
          "memory": {"ram": GIB, "vram": 0, "total": GIB}} for rank in range(3)]


def plans(*runtimes):
    return launch_plans(NODES, list(runtimes), ["tiny"], CATALOG, OPTIONS)


def local(commit="abc", cli="d1", rpc="d2", weights="w1"):
    return {"ansible_local": {
        "prima": {"commit": commit, "binaries": {"llama-cli": cli, "llama-server": "s"}},
        "llama_cpp": {"commit": commit, "binaries": {"ggml-rpc-server": rpc, "llama-completion": "c"}},
        "models": {"tiny.gguf": {"sha256": weights, "model": "tiny"}}}}


def test_agreeing_cluster_has_no_problem():
    hostvars = {"n%d" % rank: local() for rank in range(3)}
    assert agreement_problems(list(plans("prima", "llama_rpc", "single").values()), hostvars, CATALOG) == []


def test_a_different_binary_on_one_node_is_named():
    hostvars = {"n0": local(), "n1": local(rpc="XX"), "n2": local()}
    problems = agreement_problems([plans("llama_rpc")["llama_rpc-tiny"]], hostvars, CATALOG)
    assert len(problems) == 1 and problems[0].startswith("llama_rpc-tiny: the ranks run different builds")
    assert "n1: commit abc, ggml-rpc-server XX" in problems[0]


def test_missing_build_and_weights_name_the_host_and_the_fix():
    hostvars = {"n0": local(), "n1": {"ansible_local": {}}, "n2": local(weights="other")}
    problems = agreement_problems([plans("prima")["prima-tiny"]], hostvars, CATALOG)
    assert "prima-tiny: host n1 has no prima build (no /etc/ansible/facts.d/prima.fact): run site.yml on it" in problems
    assert "prima-tiny: host n1 has no verified tiny.gguf: run site.yml -e model=tiny" in problems
    assert any(problem.startswith("prima-tiny: tiny.gguf differs between nodes (n0 w1, n2 other)")
               for problem in problems)


def test_single_checks_only_rank_0():
    hostvars = {"n0": local(), "n1": {}, "n2": {}}
    assert agreement_problems([plans("single")["single-tiny"]], hostvars, CATALOG) == []


def test_probe_spec_follows_the_ring_and_the_rpc_head():
    both = list(plans("prima", "llama_rpc").values())
    spec = probe_spec(both, "n0")
    assert sorted(spec["ports"]) == [9000, 10000] and spec["expect"] == 1
    assert sorted(spec["targets"]) == ["10.0.0.1:10001", "10.0.0.1:50052", "10.0.0.1:9001", "10.0.0.2:50053"]
    last = probe_spec(both, "n2")
    assert sorted(last["ports"]) == [9002, 10002, 50053] and sorted(last["targets"]) == ["10.0.0.0:10000",
                                                                                         "10.0.0.0:9000"]
    assert probe_spec(list(plans("single").values()), "n1") == {"bind": "", "ports": [], "targets": [], "expect": 0}


def finish(exit, pid, left=False):
    return {"stdout": json.dumps({"before": {"running": exit is None, "pid": pid, "exit": exit}, "left_running": left})}


def test_rank_reports_read_what_each_host_registered():
    plan = plans("llama_rpc")["llama_rpc-tiny"]
    hostvars = {
        "n0": {"bench_finish": finish(0, 10), "bench_listen": {"skipped": True}},
        "n1": {"bench_finish": finish(0, 11), "bench_listen": {"rc": 1, "stderr": "exited with status 0 before listening"}},
        "n2": {"bench_finish": finish(None, 12, left=True), "bench_listen": {"rc": 0, "stderr": ""}},
    }
    reports = rank_reports(plan, hostvars)
    assert [(report["host"], report["role"], report["exit"], report["pid"]) for report in reports] == [
        ("n0", "head", 0, 10), ("n1", "worker", 0, 11), ("n2", "worker", None, 12)]
    assert reports[1]["listen_error"] == "exited with status 0 before listening" and reports[0]["listen_error"] == ""
    assert reports[2]["left_running"] and not reports[0]["left_running"]


def test_network_rows_per_rank_and_target():
    from ansible_collections.prima.cluster.plugins.plugin_utils.bench.checks import network

    hostvars = {"n0": {"bench_probe_result": {"rtt_ms": {"10.0.0.1:9001": 0.2, "10.0.0.1:10001": 0.3},
                                              "throughput_mbit_s": {"10.0.0.1:9001": 940.5}}},
                "n1": {"bench_probe_result": {"rtt_ms": {}}}, "n2": {}}
    rows = network(list(plans("prima").values()), hostvars)
    assert rows == [{"host": "n0", "target": "10.0.0.1:10001", "rtt_ms": 0.3, "mbit_s": None, "peer": "n1",
                     "via": "direct"},
                    {"host": "n0", "target": "10.0.0.1:9001", "rtt_ms": 0.2, "mbit_s": 940.5, "peer": "n1",
                     "via": "direct"}]


def test_probe_payload_is_half_a_second_of_a_slow_link():
    assert probe_payload_bytes(0, 16) == 16 * 1048576
    assert probe_payload_bytes(10 ** 10, 16) == 16 * 1048576
    # 10 Mbit/s: 10e6 / 8 x 0.5 s = 625,000 bytes
    assert probe_payload_bytes(10 ** 7, 16) == 625000


def test_link_shaping_of_a_step_across_hosts():
    step = {"label": "1gbit:2ms", "bits": 10 ** 9, "delay_ms": 2.0}
    notice = "this kernel has no netem qdisc"
    hosts = [{"link_result": {"shaped": True, "delay_applied": False, "notice": notice}},
             {"link_result": {"shaped": True, "delay_applied": False, "notice": notice}}]
    assert link_shaping(hosts, step) == {"shaped": True, "delay_applied": False, "notices": [notice]}
    assert link_shaping(hosts + [{}], step)["shaped"] is False
    assert link_shaping(hosts, {"label": "unshaped", "bits": 0})["shaped"] is False
