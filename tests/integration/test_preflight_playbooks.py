"""Bad input stops site.yml and bench.yml on the controller, before any node is contacted."""

import os
import textwrap

import pytest

from conftest import run_playbook

GOOD_HOSTS = {
    "a": "ansible_host: 127.0.0.2\n          cluster_ip: 10.1.0.1",
    "b": "ansible_host: 127.0.0.3\n          cluster_ip: 10.1.0.2",
}


def inventory(tmp_path, hosts):
    body = "".join("        %s:\n          %s\n" % (name, vars_) for name, vars_ in hosts.items())
    path = tmp_path / "hosts.yml"
    path.write_text(textwrap.dedent("""\
        all:
          children:
            cluster:
              hosts:
        """) + body)
    # Group vars (the model catalog) come from beside the inventory, as for the real ones.
    os.symlink(os.path.join(os.path.dirname(__file__), "..", "..", "inventory", "group_vars"),
               str(tmp_path / "group_vars"))
    return str(path)


def assert_refused_before_nodes(run, *fragments):
    assert run.status == "failed", run.describe()
    assert run.hosts == ["localhost"], "a node was contacted: " + run.describe()
    # The output folds long messages: compare with the folds undone.
    said = " ".join(run.stdout.split())
    for fragment in fragments:
        assert " ".join(fragment.split()) in said, run.describe()


@pytest.mark.parametrize("hosts, extravars, fragments", [
    ({"a": "ansible_host: 127.0.0.2", "b": GOOD_HOSTS["b"]}, {"cluster_network": "direct"},
     ["host a: cluster_ip is not set, and cluster_network is direct"]),
    (GOOD_HOSTS, {"cluster_network": "vpn"},
     ["value of cluster_network must be one of: auto, direct, ssh, got: vpn"]),
    ({"a": GOOD_HOSTS["a"], "b": "ansible_host: 127.0.0.3\n          cluster_ip: 10.1.0.1"}, {},
     ["hosts a, b: they share cluster_ip 10.1.0.1"]),
    ({"a": GOOD_HOSTS["a"] + "\n          rank: 1", "b": GOOD_HOSTS["b"] + "\n          rank: 1"}, {},
     ["hosts a, b: duplicate rank 1"]),
    (GOOD_HOSTS, {"world": 3},
     ["world=3 asks for more ranks than the 2 host(s)", "pass -e world=2"]),
    ({"a": GOOD_HOSTS["a"] + "\n          prima_jobs: many", "b": GOOD_HOSTS["b"]}, {},
     ["host a, role prima:", "prima_jobs"]),
    ({"a": GOOD_HOSTS["a"] + "\n          highs_source: zip", "b": GOOD_HOSTS["b"]}, {},
     ["host a, role highs:", "highs_source", "git, sdist"]),
    # Issue 12.
    ({"a": GOOD_HOSTS["a"] + "\n          ansible_port: abc", "b": GOOD_HOSTS["b"]}, {},
     ["host a: ansible_port 'abc' is not a port number (1-65535); set ansible_port to the port"]),
    ({"a": "ansible_host: 127.0.0.2\n          cluster_ip: 127.0.0.1", "b": GOOD_HOSTS["b"]},
     {"cluster_network": "direct"},
     ["host a: cluster_ip 127.0.0.1 is a loopback address, and cluster_network is direct"]),
    ({"a": "ansible_host: 127.0.0.2\n          cluster_ip: 0.0.0.0", "b": GOOD_HOSTS["b"]},
     {"cluster_network": "direct"},
     ["host a: cluster_ip 0.0.0.0 is the unspecified address, and cluster_network is direct"]),
    (GOOD_HOSTS, {"prima_layer_window": [4, 4, 4]},
     ["hosts a, b: prima_layer_window [4, 4, 4] gives layers to 3 rank(s), but the run has 2 (every host in group "
      "cluster)"]),
    (GOOD_HOSTS, {"prima_layer_window": "40,40", "world": 1, "model": "70b"},
     ["hosts a, b: prima_layer_window [40, 40] gives layers to 2 rank(s), but the run has 1 (-e world=1)"]),
    (GOOD_HOSTS, {"launch_rank_env": {"A; touch P; B": "1"}},
     ["hosts a, b: launch_rank_env has 'A; touch P; B', not an environment variable name"]),
], ids=["missing-cluster-ip", "bad-cluster-network", "duplicate-cluster-ip", "duplicate-rank", "world-too-large",
        "mistyped-role-input", "bad-choice", "ansible-port", "loopback-cluster-ip", "unspecified-cluster-ip",
        "layer-window-length", "layer-window-world", "rank-env-name"])
def test_site_refuses_bad_inventory(tmp_path, hosts, extravars, fragments):
    run = run_playbook("site.yml", inventory=inventory(tmp_path, hosts), extravars=extravars,
                       label="preflight-site")
    assert_refused_before_nodes(run, *fragments)


def test_bench_refuses_unknown_model(tmp_path):
    run = run_playbook("bench.yml", inventory=inventory(tmp_path, GOOD_HOSTS), extravars={"model": "13b"},
                       label="preflight-bench")
    assert_refused_before_nodes(run, "model '13b' is not in the model catalog", "known keys: 32b, 70b, 8b")


def test_site_refuses_unknown_model(tmp_path):
    run = run_playbook("site.yml", inventory=inventory(tmp_path, GOOD_HOSTS), extravars={"model": "8b,13b"},
                       label="preflight-site-model")
    assert_refused_before_nodes(run, "model '13b' is not in the model catalog", "known keys: 32b, 70b, 8b")


def test_site_refuses_a_malformed_catalog_entry(tmp_path):
    catalog = {"broken": {"hub_repo": "nobody", "revision": "main", "n_layer": 8,
                          "files": [{"name": "x.gguf", "size": 10, "sha256": "short"}]}}
    run = run_playbook("site.yml", inventory=inventory(tmp_path, GOOD_HOSTS),
                       extravars={"models_extra_catalog": catalog}, label="preflight-site-catalog")
    assert_refused_before_nodes(run, "host a: models_extra_catalog['broken'].hub_repo 'nobody' is not an 'owner/name'",
                                "(x.gguf): sha256 'short' is not 64 hex digits")


def test_site_refuses_catalog_names_that_reach_paths_and_units(tmp_path):
    """Issue 12: a key with a space or newline, a file name with ../ and an empty revision got past the preflight."""
    catalog = {"a b\nc": {"hub_repo": "org/repo", "revision": "", "n_layer": 8,
                          "files": [{"name": "../x.gguf", "size": 10}]}}
    run = run_playbook("site.yml", inventory=inventory(tmp_path, GOOD_HOSTS),
                       extravars={"models_extra_catalog": catalog}, label="preflight-site-catalog-names")
    assert_refused_before_nodes(run, "host a: models_extra_catalog['a b\\\\nc']: the key 'a b\\\\nc' may only hold",
                                "host a: models_extra_catalog['a b\\\\nc'].revision is empty; set it to a branch",
                                "host a: models_extra_catalog['a b\\\\nc'].files[0] name '../x.gguf' is not a "
                                "plain file name")


def test_bench_refuses_bad_runtime_and_runs(tmp_path):
    run = run_playbook("bench.yml", inventory=inventory(tmp_path, GOOD_HOSTS),
                       extravars={"model": "70b", "runtime": "vllm", "runs": 0}, label="preflight-bench")
    assert_refused_before_nodes(run, "runtime 'vllm' is not one of: prima, llama_rpc, single, or all",
                                "runs '0' is not a whole number >= 1")


def test_bench_refuses_prima_where_it_is_not_built(tmp_path):
    run = run_playbook("bench.yml", inventory=inventory(tmp_path, GOOD_HOSTS),
                       extravars={"model": "70b", "runtime": "prima", "prima_enabled": False}, label="preflight-bench")
    assert_refused_before_nodes(run, "runtime=prima: prima.cpp is not built on this cluster",
                                "pick -e runtime=llama_rpc,single (or all)")


def test_bench_accepts_good_input_then_goes_to_the_nodes(tmp_path):
    reports = tmp_path / "reports"
    run = run_playbook("bench.yml", inventory=inventory(tmp_path, GOOD_HOSTS), extravars={"model": "70b"},
                       label="preflight-bench-good", envvars={"PRIMA_BENCH_REPORTS_DIR": str(reports)})
    # The input passes on the controller; the nodes here are loopback addresses without sshd.
    assert "input needs fixing" not in run.stdout and "needs fixing before any node" not in run.stdout
    assert sorted(run.count("dark")) == ["a", "b"], run.describe()
    assert not (reports / "results.jsonl").exists()
