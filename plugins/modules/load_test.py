#!/usr/bin/python
"""Ansible module: load a llama-server with chat completions, sequential then concurrent, and record the timings."""

DOCUMENTATION = r"""
---
module: load_test
short_description: Time a llama-server's chat completions, one at a time and under concurrent clients
description:
  - Runs where the clients should be (bench.yml -e mode=server, rank 0, over the loopback) against the
    OpenAI-compatible C(/v1/chat/completions) of a llama-server, with an C(Authorization) bearer header when
    C(api_key) is given.
  - First C(warmup) then C(runs) non-streamed requests, one after another; each answer's C(timings) (the
    server's own prompt and decode figures) is returned.
  - Then, for each client count of C(clients), that many clients at once, each sending C(requests_per_client)
    streamed requests one after another; every request is returned as recorded (when it was sent, when each
    server-sent event arrived, its HTTP status, what went wrong). The figures (time to first token, inter-token
    latency, percentiles) are computed on the controller (action C(prima.cluster.bench_server_record)).
  - A failed request is data, not a failure of the task; the records say what went wrong. The task fails only
    on arguments it cannot use.
options:
  host:
    description: Where the server listens, seen from this node.
    type: str
    default: 127.0.0.1
  port:
    description: The server's port.
    type: int
    required: true
  api_key:
    description: The key the server requires (empty, none is sent).
    type: str
    default: ""
  prompt:
    description: The user message of every request.
    type: str
    required: true
  max_tokens:
    description: Tokens each request asks for.
    type: int
    required: true
  warmup:
    description: Sequential requests before the measured ones (returned, marked as warm-up).
    type: int
    default: 1
  runs:
    description: Measured sequential requests.
    type: int
    default: 3
  clients:
    description: The concurrency sweep, client counts in order (empty, no sweep).
    type: list
    elements: int
    default: []
  requests_per_client:
    description: Streamed requests each client sends, one after another.
    type: int
    default: 2
  timeout_s:
    description: The longest one request may take, all told (connecting, headers, every event of its answer).
    type: float
    default: 600
  arrivals_cap:
    description: >-
      Server-sent events kept per streamed request, so that the result stays bounded; it must exceed
      C(max_tokens) (one event per token, plus the role's and the final chunk) so that none is lost.
    type: int
    default: 4096
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Load the server on this node
  prima.cluster.load_test:
    port: 8080
    api_key: "{{ bench_server_api_key }}"
    prompt: Once upon a time
    max_tokens: 32
    runs: 3
    clients: [1, 2, 4]
  no_log: true
"""

RETURN = r"""
sequential:
  description: The sequential requests in order, each {warmup, sent, done, status, timings, usage, error}.
  type: list
  elements: dict
  returned: always
levels:
  description: >-
    One entry per client count, {clients, wall_s, requests}, each request {sent, done, status, arrivals, dropped,
    error}; times are seconds on this node's monotonic clock, arrivals [time, decoded event]. Past a budget of
    bytes per request (256 KiB) an event is kept as its digest, {content_length, timings, error}: the length of
    its content, not the text; its timings when the latest, its error when the first.
  type: list
  elements: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.prima.cluster.plugins.module_utils.load_client import complete, completion_body, run_level

# Events of a streamed request besides its tokens: the role's chunk, the final (finish_reason, timings) chunk,
# and room for a usage chunk or two.
EXTRA_EVENTS = 8


def argument_problems(params):
    """What makes the arguments unusable, as sentences (empty when they are fine)."""
    problems = []
    for name in ("max_tokens", "runs", "requests_per_client", "arrivals_cap"):
        if params[name] < 1:
            problems.append("%s must be 1 or more, not %d" % (name, params[name]))
    if params["warmup"] < 0:
        problems.append("warmup must be 0 or more, not %d" % params["warmup"])
    if any(count < 1 for count in params["clients"]):
        problems.append("clients must be whole numbers >= 1, not %s" % params["clients"])
    if params["arrivals_cap"] < params["max_tokens"] + EXTRA_EVENTS:
        problems.append("arrivals_cap %d keeps fewer events than max_tokens %d needs (max_tokens + %d)"
                        % (params["arrivals_cap"], params["max_tokens"], EXTRA_EVENTS))
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            api_key=dict(type="str", default="", no_log=True),
            prompt=dict(type="str", required=True),
            max_tokens=dict(type="int", required=True, no_log=False),
            warmup=dict(type="int", default=1),
            runs=dict(type="int", default=3),
            clients=dict(type="list", elements="int", default=[]),
            requests_per_client=dict(type="int", default=2),
            timeout_s=dict(type="float", default=600.0),
            arrivals_cap=dict(type="int", default=4096),
        ),
        supports_check_mode=False,
    )
    params = module.params
    problems = argument_problems(params)
    if problems:
        module.fail_json(msg="load_test: " + "; ".join(problems))
    address = (params["host"], params["port"], params["api_key"])
    body = completion_body(params["prompt"], params["max_tokens"])
    sequential = []
    for index in range(params["warmup"] + params["runs"]):
        record = complete(*address, body=body, timeout_s=params["timeout_s"])
        record["warmup"] = index < params["warmup"]
        sequential.append(record)
    levels = [run_level(*address, clients=count, requests_per_client=params["requests_per_client"],
                        prompt=params["prompt"], max_tokens=params["max_tokens"], timeout_s=params["timeout_s"],
                        max_events=params["arrivals_cap"])
              for count in params["clients"]]
    module.exit_json(changed=False, sequential=sequential, levels=levels)


if __name__ == "__main__":
    main()
