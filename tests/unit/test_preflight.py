import os

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import model_selection_problems
from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import (
    choice_problems, cluster_problems, cluster_ranks, layer_window_problems, positive_int_problems, rank_env_problems,
    role_argument_specs, role_input_problems)

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
    assert model_selection_problems("70b", catalog) == []
    assert model_selection_problems("8b,32b", catalog) == []
    [problem] = model_selection_problems("13b", catalog)
    assert "model '13b' is not in the model catalog" in problem
    assert problem.endswith("known keys: 32b, 70b, 8b")
    [problem] = model_selection_problems(None, catalog)
    assert problem.startswith("model is empty; pass -e model=KEY")


def test_choices_and_counts():
    assert choice_problems("prima", ["prima", "all"], "runtime") == []
    assert choice_problems("vllm", ["prima", "all"], "runtime") == [
        "runtime 'vllm' is not one of: prima, all; pass -e runtime=prima"]
    assert positive_int_problems("3", "runs") == []
    assert positive_int_problems(0, "runs") == ["runs '0' is not a whole number >= 1; pass -e runs=N"]


@pytest.mark.parametrize("variable", ["ansible_port", "cluster_ssh_port"])
@pytest.mark.parametrize("port", ["abc", 0, 70000, "22x", -1, True])
def test_ssh_ports_must_be_port_numbers(variable, port):
    """Issue 12: ansible_port: abc got past the preflight."""
    hosts, hostvars = hosts_of(a={"cluster_ip": "10.0.0.1", variable: port}, b={"cluster_ip": "10.0.0.2"})
    [problem] = cluster_problems(hosts, hostvars)
    assert problem.startswith("host a: %s %r is not a port number (1-65535); set %s to the port " % (
        variable, port, variable))
    assert problem.endswith("or remove it for 22")


def test_good_ssh_ports():
    hosts, hostvars = hosts_of(a={"cluster_ip": "10.0.0.1", "ansible_port": 23001, "cluster_ssh_port": "22"},
                               b={"cluster_ip": "10.0.0.2", "ansible_port": "65535"}, c={"cluster_ip": "10.0.0.3"})
    assert cluster_problems(hosts, hostvars) == []


@pytest.mark.parametrize("address, kind", [
    ("0.0.0.0", "the unspecified address"), ("::", "the unspecified address"), ("127.0.0.1", "a loopback address"),
    ("127.0.1.1", "a loopback address"), ("::1", "a loopback address"), ("::ffff:127.0.0.1", "a loopback address"),
    ("localhost", "a loopback address"), ("LOCALHOST", "a loopback address")])
def test_direct_refuses_a_cluster_ip_no_peer_reaches(address, kind):
    """Issue 12: the fan-out server and ggml-rpc-server -H bind to cluster_ip; direct took 0.0.0.0 and 127.0.0.1."""
    hosts, hostvars = hosts_of(a={"cluster_ip": address, "cluster_network": "direct"},
                               b={"cluster_ip": "10.0.0.2", "cluster_network": "direct"})
    [problem] = cluster_problems(hosts, hostvars)
    assert problem.startswith("host a: cluster_ip %s is %s, and cluster_network is direct: " % (address, kind))
    assert "bind to cluster_ip" in problem and problem.endswith("or use cluster_network auto or ssh")
    # auto: the probe decides (it finds no path and picks ssh); ssh needs no cluster_ip at all.
    for network in ("auto", "ssh"):
        hosts, hostvars = hosts_of(a={"cluster_ip": address, "cluster_network": network},
                                   b={"cluster_ip": "10.0.0.2", "cluster_network": network})
        assert cluster_problems(hosts, hostvars) == []


def test_direct_takes_private_public_and_named_addresses():
    hosts, hostvars = hosts_of(a={"cluster_ip": "10.0.0.1", "cluster_network": "direct"},
                               b={"cluster_ip": "203.0.113.7", "cluster_network": "direct"},
                               c={"cluster_ip": "node-c.internal", "cluster_network": "direct"})
    assert cluster_problems(hosts, hostvars) == []


CATALOG = {"tiny": {"n_layer": 8}, "70b": {"n_layer": 80}}


def window_hosts(count, window, **extra):
    return hosts_of(**{"n%d" % rank: dict({"prima_layer_window": window}, **extra) for rank in range(count)})


@pytest.mark.parametrize("window", [[3, 3, 2], "3,3,2", "[3, 3, 2]", "auto", "prima", None])
def test_layer_window_with_one_count_per_rank(window):
    hosts, hostvars = window_hosts(3, window)
    assert layer_window_problems(hosts, hostvars, None, "tiny", CATALOG) == []


def test_layer_window_length_is_the_world_size():
    """Issue 12: a prima_layer_window whose length is not the world size got past the preflight."""
    hosts, hostvars = window_hosts(3, [4, 4])
    assert layer_window_problems(hosts, hostvars, None, "tiny", CATALOG) == [
        "hosts n0, n1, n2: prima_layer_window [4, 4] gives layers to 2 rank(s), but the run has 3 (every host in "
        "group cluster); give one layer count per rank, or set prima_layer_window to auto"]
    # -e world=N takes the first N ranks: the window is theirs.
    assert layer_window_problems(hosts, hostvars, "2", "tiny", CATALOG) == []
    [problem] = layer_window_problems(hosts, hostvars, 1, "tiny", CATALOG)
    assert "but the run has 1 (-e world=1)" in problem
    # A bad world is cluster_problems' to name; the window is held to every host then.
    assert layer_window_problems(hosts, hostvars, "x", "tiny", CATALOG)[0].endswith(
        "but the run has 3 (every host in group cluster); give one layer count per rank, or set "
        "prima_layer_window to auto")


def test_layer_window_sums_to_each_models_layers():
    hosts, hostvars = window_hosts(2, [40, 40])
    assert layer_window_problems(hosts, hostvars, None, "70b", CATALOG) == []
    assert layer_window_problems(hosts, hostvars, None, ["70b", "13b"], CATALOG) == []  # 13b: model_selection_problems
    [problem] = layer_window_problems(hosts, hostvars, None, "70b,tiny", CATALOG)
    assert problem == ("hosts n0, n1: prima_layer_window [40, 40] sums to 80 layers, but model tiny has n_layer 8; "
                       "make the counts sum to 8, pick the model it is for with -e model=KEY, or set "
                       "prima_layer_window to auto")


@pytest.mark.parametrize("window", ["fast", [3, 0, 5], "3;3;2", [3, "x", 2], [], [1.5, 3, 3.5]])
def test_layer_window_that_is_no_window(window):
    hosts, hostvars = window_hosts(3, window)
    [problem] = layer_window_problems(hosts, hostvars, None, "tiny", CATALOG)
    assert problem.startswith("hosts n0, n1, n2: prima_layer_window %r is not auto, prima, or the layers" % (window,))
    assert problem.endswith("set it to auto, prima or a list like [3, 3, 2]")


def test_layer_window_per_host():
    hosts, hostvars = hosts_of(n0={"prima_layer_window": [8]}, n1={"prima_layer_window": [3, 3, 2]}, n2={})
    [problem] = layer_window_problems(hosts, hostvars, None, "tiny", CATALOG)
    assert problem.startswith("host n0: prima_layer_window [8] gives layers to 1 rank(s), but the run has 3")


def test_rank_env_names():
    """Issue 12: launch_rank_env {"A; touch P; B": "1"} ran touch on `status`; now it stops on the controller."""
    hosts, hostvars = hosts_of(a={"launch_rank_env": {"A; touch P; B": "1", "OK": "x; y"}},
                               b={"launch_rank_env": {"A; touch P; B": "1"}},
                               c={"launch_rank_env": {"A\n": "1", "1X": "2", "GOOD_1": "$(x)"}},
                               d={"launch_rank_env": "not a mapping"}, e={})
    assert rank_env_problems(hosts, hostvars) == [
        "hosts a, b: launch_rank_env has 'A; touch P; B', not an environment variable name (letters, digits and "
        "_, not starting with a digit): the rank's environment is passed as NAME=value words; rename or remove it",
        "host c: launch_rank_env has '1X', 'A\\n', not an environment variable name (letters, digits and _, not "
        "starting with a digit): the rank's environment is passed as NAME=value words; rename or remove them"]


def test_rank_env_refuses_shell_control_variables():
    """Review 2: IFS in launch_rank_env made the launcher's `stop` loops run once (SIGKILL after 0.1 s). The
    environment now reaches the rank alone, and names that steer a shell are refused even there; PATH and LD_*
    (CUDA) stay allowed."""
    hosts, hostvars = hosts_of(a={"launch_rank_env": {"IFS": ":", "BASH_FUNC_f": "() { :; }", "OK": "1"}},
                               b={"launch_rank_env": {"BASH_ENV": "/tmp/x", "1X": "2"}},
                               c={"launch_rank_env": {"PATH": "/usr/local/cuda/bin:/usr/bin", "LD_PRELOAD": "x.so",
                                                      "LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "timeout_s": "0"}})
    assert rank_env_problems(hosts, hostvars) == [
        "host b: launch_rank_env has '1X', not an environment variable name (letters, digits and _, not starting "
        "with a digit): the rank's environment is passed as NAME=value words; rename or remove it",
        "host a: launch_rank_env has 'BASH_FUNC_f', 'IFS', each a shell control variable: it would change how any "
        "shell the rank starts runs (word splitting, startup files, options), not what the rank does; remove them",
        "host b: launch_rank_env has 'BASH_ENV', a shell control variable: it would change how any shell the rank "
        "starts runs (word splitting, startup files, options), not what the rank does; remove it"]
    for name in ("ENV", "SHELLOPTS", "BASHOPTS", "PS4", "BASH_XTRACEFD"):
        assert "a shell control variable" in rank_env_problems(["n"], {"n": {"launch_rank_env": {name: "1"}}})[0]
