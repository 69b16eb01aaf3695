"""The load_test module's own checks (plugins/modules/load_test.py): arguments it cannot use fail the task before
any request, and whatever a request meets is that request's error, not the module's end; the requests themselves
are in test_load_client.py (whose scripted server this borrows) and the sandbox's test_bench_server.py."""

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.prima.cluster.plugins.modules import load_test
from ansible_collections.prima.cluster.plugins.modules.load_test import EXTRA_EVENTS, argument_problems
from test_load_client import KEY, server  # noqa: F401  # pylint: disable=unused-import  # the scripted server

GOOD = {"max_tokens": 32, "runs": 3, "requests_per_client": 2, "arrivals_cap": 4096, "warmup": 1, "clients": [1, 2]}


def test_good_arguments_have_no_problem():
    assert argument_problems(GOOD) == []
    assert argument_problems(dict(GOOD, warmup=0, clients=[])) == []


def test_each_unusable_argument_is_named():
    assert argument_problems(dict(GOOD, runs=0, warmup=-1, clients=[2, 0])) == [
        "runs must be 1 or more, not 0", "warmup must be 0 or more, not -1",
        "clients must be whole numbers >= 1, not [2, 0]"]


def test_the_cap_must_hold_every_token_of_a_request():
    assert argument_problems(dict(GOOD, max_tokens=100, arrivals_cap=100 + EXTRA_EVENTS)) == []
    assert argument_problems(dict(GOOD, max_tokens=100, arrivals_cap=100)) == [
        "arrivals_cap 100 keeps fewer events than max_tokens 100 needs (max_tokens + 8)"]


def run_module(args):
    """The module's main() in this process, as Ansible runs it with `args`; it ends by exit_json or fail_json."""
    with patch_module_args(args), pytest.raises(SystemExit):
        load_test.main()


def test_an_answer_nested_too_deep_is_a_requests_error_not_a_crashed_module(server, capsys):
    run_module({"port": server, "api_key": KEY, "prompt": "NEST a", "max_tokens": 4, "warmup": 0, "runs": 1,
                "clients": [1], "requests_per_client": 1, "timeout_s": 10, "arrivals_cap": 16})
    result = json.loads(capsys.readouterr().out)
    assert not result.get("failed"), result
    [request] = result["sequential"]
    assert request["error"].startswith("the answer is not a JSON object: [[[") and request["warmup"] is False
    [level] = result["levels"]
    assert [request["error"] for request in level["requests"]] == [None]
