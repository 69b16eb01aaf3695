"""The run computed once (plugin_utils/cluster/run_plan.py): what bench.yml's and serve.yml's plays take from it."""

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.run_plan import RunPlanError, run_plan
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import launch_plans
from test_launch import TINY, nodes, options

CATALOG = {"tiny": TINY, "8b": TINY, "70b": TINY}
KEY = "k" * 24
HOSTS = ["n0", "n1", "n2"]
HOSTVARS = {host: {} for host in HOSTS}


def bench(values, prima_built=True, key="", hostvars=None):
    return run_plan("bench", values, CATALOG, prima_built, key, HOSTS, HOSTVARS if hostvars is None else hostvars)


def problems(call):
    with pytest.raises(RunPlanError) as caught:
        call()
    return caught.value.problems, str(caught.value)


def test_a_bench_of_one_model_takes_the_defaults():
    run = bench({"model": "70b"})
    assert run == {"models": ["70b"], "runtimes": ["prima"], "plan_names": ["prima-70b"], "runs": 3, "mode": "run",
                   "clients": [1, 2, 4], "link_steps": [{"label": "unshaped", "bits": 0, "delay_ms": 0.0}],
                   "notices": []}


def test_plan_names_are_the_planners_own_runtime_by_runtime():
    run = bench({"model": "8b,tiny", "runtime": "all", "runs": "2", "links": "1gbit,10gbit"})
    assert run["runtimes"] == ["prima", "llama_rpc", "single"]
    assert run["plan_names"] == ["prima-8b", "prima-tiny", "llama_rpc-8b", "llama_rpc-tiny", "single-8b",
                                 "single-tiny"]
    planned = launch_plans(nodes(3), run["runtimes"], run["models"], CATALOG, options())
    assert sorted(planned) == sorted(run["plan_names"])
    assert run["runs"] == 2 and [step["label"] for step in run["link_steps"]] == ["1gbit", "10gbit"]


def test_runtime_all_without_prima_leaves_it_out_and_says_so():
    run = bench({"model": "tiny", "runtime": "all"}, prima_built=False)
    assert run["runtimes"] == ["llama_rpc", "single"]
    assert run["notices"] == ["runtime=all without prima.cpp: it is not built on this cluster (prima_enabled is false)"]


def test_clients_outside_server_mode_are_a_notice_not_a_sweep():
    run = bench({"model": "tiny", "runtime": "single", "clients": "8,16"})
    assert run["clients"] == [1, 2, 4]
    assert run["notices"] == ["clients=8,16 is ignored: only -e mode=server runs the concurrency sweep"]
    served = bench({"model": "tiny", "runtime": "single", "mode": "server", "clients": "8,16,8"}, key=KEY)
    assert served["clients"] == [8, 16] and served["notices"] == []


def test_every_problem_is_named_at_once_before_anything_is_chosen():
    found, message = problems(lambda: bench(
        {"model": "tiny;reboot", "runtime": "prima,vllm", "runs": "0", "links": "fast", "mode": "serve"},
        prima_built=False, hostvars={"n0": {"glows_price_cent": "cheap"}, "n1": {}, "n2": {}}))
    assert message.startswith("bench.yml input needs fixing:\n")
    assert any(line.startswith("model 'tiny;reboot' is not in the model catalog") for line in found)
    assert any(line.startswith("runtime 'vllm' is not one of") for line in found)
    assert any(line.startswith("runs '0' is not a whole number >= 1") for line in found)
    assert any("fast" in line for line in found)
    assert any(line.startswith("host n0: glows_price_cent") for line in found)
    assert any(line.startswith("runtime=prima: prima.cpp is not built on this cluster") for line in found)
    assert any(line.startswith("mode 'serve' is not one of: run, server") for line in found)
    assert len(found) == 7


def test_a_bench_without_a_model_is_refused_naming_the_keys():
    found, dummy = problems(lambda: bench({}))
    assert found == ["model is empty; pass -e model=KEY with KEY one of: 70b, 8b, tiny"]


@pytest.mark.parametrize("key", ["", "short", "k" * 20 + "\n" + "k" * 4, None])
def test_server_mode_needs_a_usable_key_and_clients(key):
    found, dummy = problems(lambda: bench({"model": "tiny", "mode": "server", "clients": "0,x"}, key=key))
    assert [line.split(" ")[0] for line in found] == ["clients", "vault_serve_api_key:"]
    assert KEY not in str(found)


def test_a_model_with_a_newline_is_refused_not_split():
    found, dummy = problems(lambda: bench({"model": "tiny\n70b"}))
    assert len(found) == 1 and "'tiny\n70b' is not in the model catalog" in found[0]


def serve(values, prima_built=True, key=KEY):
    return run_plan("serve", values, CATALOG, prima_built, key)


def test_serve_started_names_its_server_unit():
    assert serve({"model": "70b", "runtime": "llama_rpc"}) == {
        "state": "started", "starts": True, "model": "70b", "runtime": "llama_rpc", "unit": "serve-llama_rpc-70b"}


def test_serve_status_and_stop_need_no_model_nor_key():
    assert serve({"state": "status"}, key="")["starts"] is False
    assert serve({"state": "stopped", "runtime": "prima"}, prima_built=False, key="")["unit"] == "serve-prima-"


def test_serve_refuses_two_models_an_unknown_runtime_and_prima_unbuilt_at_once():
    found, message = problems(lambda: serve({"state": "restarted", "model": "tiny,8b", "runtime": "vllm"}, key=""))
    assert message.startswith("serve.yml input needs fixing:\n")
    assert any(line == "model: serve.yml serves one model at a time, not tiny,8b" for line in found)
    assert any(line.startswith("runtime 'vllm' is not one of: prima, llama_rpc, single") for line in found)
    assert any(line.startswith("vault_serve_api_key:") for line in found)
    found, dummy = problems(lambda: serve({"model": "tiny"}, prima_built=False))
    assert found == ["runtime=prima: prima.cpp is not built on this cluster (prima_enabled is false); build it "
                     "with site.yml (the sandbox needs PRIMA_CPP_MIRROR) or pick -e runtime=llama_rpc|single"]
    found, dummy = problems(lambda: serve({"state": "up"}))
    assert found[0].startswith("state 'up' is not one of: started, stopped, restarted, status")


def test_an_unknown_playbook_is_a_programming_error():
    with pytest.raises(ValueError, match="site"):
        run_plan("site", {}, CATALOG, True, "")
