import os

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.catalog import catalog_problems
from ansible_collections.prima.cluster.plugins.plugin_utils.preflight import (choice_problems, cluster_problems,
                                                                              cluster_ranks, positive_int_problems,
                                                                              role_argument_specs,
                                                                              role_input_problems)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hosts_of(**hostvars):
    return list(hostvars), hostvars


def test_good_cluster_has_no_problems():
    hosts, hostvars = hosts_of(a={"cluster_ip": "10.0.0.1"}, b={"cluster_ip": "10.0.0.2"})
    assert cluster_problems(hosts, hostvars, world=2) == []


def test_missing_cluster_ip_names_host_and_variable():
    hosts, hostvars = hosts_of(a={"cluster_ip": "10.0.0.1", "cluster_network": "direct"},
                               b={"ansible_host": "x", "cluster_network": "direct"})
    [problem] = cluster_problems(hosts, hostvars)
    assert problem.startswith("host b: cluster_ip is not set, and cluster_network is direct")
    assert "not its SSH access address" in problem


def test_the_ssh_transport_needs_no_cluster_ip():
    for network in ("auto", "ssh"):
        hosts, hostvars = hosts_of(a={"cluster_network": network}, b={"cluster_network": network})
        assert cluster_problems(hosts, hostvars) == []


def test_blank_and_malformed_cluster_ip():
    hosts, hostvars = hosts_of(a={"cluster_ip": " ", "cluster_network": "direct"}, b={"cluster_ip": "10.0.0.300"})
    problems = cluster_problems(hosts, hostvars)
    assert "host a: cluster_ip is not set" in problems[0]
    assert "host b: cluster_ip '10.0.0.300' is not an IP address" in problems[1]


def test_host_names_are_addresses():
    hosts, hostvars = hosts_of(a={"cluster_ip": "node-a.internal"}, b={"cluster_ip": "fd00::2"})
    assert cluster_problems(hosts, hostvars) == []


def test_duplicate_cluster_ip_names_both_hosts():
    hosts, hostvars = hosts_of(a={"cluster_ip": "10.0.0.1"}, b={"cluster_ip": "10.0.0.1"},
                               c={"cluster_ip": "10.0.0.3"})
    assert cluster_problems(hosts, hostvars) == [
        "hosts a, b: they share cluster_ip 10.0.0.1; give each host its own cluster_ip"]


def test_ranks_default_to_group_order():
    hosts, hostvars = hosts_of(b={"cluster_ip": "1.1.1.2"}, a={"cluster_ip": "1.1.1.1"})
    assert cluster_ranks(hosts, hostvars) == {"b": 0, "a": 1}


def test_explicit_ranks_are_used():
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1", "rank": 1}, b={"cluster_ip": "1.1.1.2", "rank": "0"})
    assert cluster_problems(hosts, hostvars) == []
    assert cluster_ranks(hosts, hostvars) == {"a": 1, "b": 0}


def test_duplicate_ranks():
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1", "rank": 0}, b={"cluster_ip": "1.1.1.2", "rank": 0})
    assert cluster_problems(hosts, hostvars) == ["hosts a, b: duplicate rank 0; each host needs its own rank"]


def test_ranks_with_a_gap():
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1", "rank": 0}, b={"cluster_ip": "1.1.1.2", "rank": 2})
    [problem] = cluster_problems(hosts, hostvars)
    assert problem.startswith("ranks a=0, b=2: ranks must be 0..1")


def test_some_hosts_without_rank():
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1", "rank": 0}, b={"cluster_ip": "1.1.1.2"})
    [problem] = cluster_problems(hosts, hostvars)
    assert problem.startswith("hosts b: no rank while a have one")


@pytest.mark.parametrize("rank", [-1, "one", True, 1.5])
def test_rank_that_is_not_a_whole_number(rank):
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1", "rank": rank}, b={"cluster_ip": "1.1.1.2", "rank": 1})
    [problem] = cluster_problems(hosts, hostvars)
    assert problem.startswith("host a: rank '%s' is not a whole number" % rank)


def test_world_larger_than_cluster():
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1"}, b={"cluster_ip": "1.1.1.2"})
    assert cluster_problems(hosts, hostvars, world=3) == [
        "world=3 asks for more ranks than the 2 host(s) in group 'cluster' (a, b); add hosts to the "
        "inventory or pass -e world=2"]


@pytest.mark.parametrize("world", [0, "x", -2])
def test_world_not_positive(world):
    hosts, hostvars = hosts_of(a={"cluster_ip": "1.1.1.1"})
    [problem] = cluster_problems(hosts, hostvars, world=world)
    assert problem.startswith("world '%s' is not a whole number >= 1" % world)


def test_empty_group():
    [problem] = cluster_problems([], {})
    assert "no hosts in group 'cluster'" in problem


def test_role_inputs_checked_against_the_real_argument_specs():
    specs = role_argument_specs(os.path.join(REPO, "roles"))
    assert {"prima", "llama_cpp", "highs", "cluster", "link", "pinned_build"} <= set(specs)
    assert "link_step" in specs["link"] and "link_guard_quiet_s" in specs["link"]  # every entry point's inputs
    hostvars = {
        "a": {"prima_jobs": "many", "llama_cpp_source": "tarball", "unrelated": 1, "cluster_rpc_port": "fifty"},
        "b": {"prima_jobs": "4", "highs_build_throttle": 1},
    }
    problems = sorted(role_input_problems(["a", "b"], hostvars, specs))
    assert len(problems) == 3, problems
    assert problems[0].startswith("host a, role cluster: ") and "cluster_rpc_port" in problems[0]
    assert problems[1].startswith("host a, role llama_cpp: ")
    assert "llama_cpp_source" in problems[1] and "git, sdist" in problems[1]
    assert problems[2].startswith("host a, role prima: ") and "prima_jobs" in problems[2]


def test_every_role_has_an_argument_spec_for_each_default():
    import yaml

    roles_dir = os.path.join(REPO, "roles")
    for role in sorted(os.listdir(roles_dir)):
        spec_path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        assert os.path.exists(spec_path), "role %s has no meta/argument_specs.yml" % role
        defaults_path = os.path.join(roles_dir, role, "defaults", "main.yml")
        if not os.path.exists(defaults_path):
            continue
        with open(defaults_path) as handle:
            defaults = yaml.safe_load(handle) or {}
        with open(spec_path) as handle:
            options = {}
            for entry in yaml.safe_load(handle)["argument_specs"].values():
                options.update(entry.get("options", {}))
        missing = sorted(set(defaults) - set(options))
        assert not missing, "role %s: defaults without argument spec: %s" % (role, missing)
        unprefixed = sorted(name for name in defaults if not name.startswith(role + "_"))
        assert not unprefixed, "role %s: variables not prefixed with the role name: %s" % (role, unprefixed)


def test_unknown_model_lists_known_keys():
    catalog = {"8b": {}, "70b": {}, "32b": {}}
    assert catalog_problems("70b", catalog) == []
    assert catalog_problems("8b,32b", catalog) == []
    [problem] = catalog_problems("13b", catalog)
    assert "model '13b' is not in the model catalog" in problem
    assert problem.endswith("known keys: 32b, 70b, 8b")
    [problem] = catalog_problems(None, catalog)
    assert problem.startswith("model is empty; pass -e model=KEY")


def test_choices_and_counts():
    assert choice_problems("prima", ["prima", "all"], "runtime") == []
    assert choice_problems("vllm", ["prima", "all"], "runtime") == [
        "runtime 'vllm' is not one of: prima, all; pass -e runtime=prima"]
    assert positive_int_problems("3", "runs") == []
    assert positive_int_problems(0, "runs") == ["runs '0' is not a whole number >= 1; pass -e runs=N"]
