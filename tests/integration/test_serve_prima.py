"""serve.yml with prima.cpp's ring (where a mirror of prima.cpp is given): llama-server on rank 0 with the ring's
arguments, llama-cli on the others; it answers, and its stop ends in the 139 prima.cpp's llama-server exits with on
every shutdown, said to be clean."""

import json

import pytest

from conftest import PRIMA, rank_processes
from test_serve import chat, openai_client_checks, serving

NO_MIRROR = ("prima.cpp is built on the sandbox only from a mirror: set PRIMA_CPP_MIRROR (and PRIMA_CPP_VERSION for "
             "a snapshot's commit)")
pytestmark = pytest.mark.skipif(not PRIMA, reason=NO_MIRROR)


def test_prima_ring_serves_and_its_139_on_stop_is_a_clean_stop(provisioned):
    with serving("serve-prima", runtime="prima", serve_restarts=0, serve_parallel=1, serve_ctx_size=512) as served:
        status, body = chat(served["port"], served["key"])
        # prima.cpp's llama-server (build 4231) answers a chat completion without `timings`.
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] > 0
        openai_client_checks(served["port"], served["key"], "prima")
    stopped = served["stopped"]
    assert "last stop: clean" in stopped.messages
    assert any(line.startswith("  rank 0 on n0: llama-server of prima.cpp exits 139") and line.endswith("(clean)")
               for line in stopped.messages), stopped.messages
    assert rank_processes() == []
