"""The load_test module's own checks (plugins/modules/load_test.py): arguments it cannot use fail the task before
any request; the requests themselves are in test_load_client.py and the sandbox's test_bench_server.py."""

from ansible_collections.prima.cluster.plugins.modules.load_test import EXTRA_EVENTS, argument_problems

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
