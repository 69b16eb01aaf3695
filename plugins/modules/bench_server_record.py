# The action plugin plugins/action/bench_server_record.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: bench_server_record
short_description: Keep one server load test's requests and what its records are made of
description:
  - Runs on the controller after C(prima.cluster.load_test) loaded a server of bench.yml -e mode=server.
    Writes the load test's requests, as measured, to C(raw_dir)/<head>/<unit>/<link>/load.json.
  - Writes C(judged.json) beside C(load.json) (the plan and C(meta)); the report is made from those files
    (M(prima.cluster.bench_write_report)). Returns the records, one per sequential request
    (mode C(server), its C(perf) from the server's own C(timings), under the keys of a mode=run run) and one per
    concurrency level (mode C(server-load), with clients, requests, TTFT and ITL p50/p95/p99, aggregate t/s, errors).
  - Fails when the load test failed or a measured sequential request failed (the requests are kept);
    failed requests of a concurrency level are counted as errors in its record, with a warning.
options:
  plan:
    description: The server unit's plan (the serve role's C(serve_plan)).
    type: dict
    required: true
  result:
    description: What C(prima.cluster.load_test) returned (registered).
    type: dict
    required: true
  raw_dir:
    description: The run's raw directory on the controller.
    type: path
    required: true
  meta:
    description: Copied into every record (run id, link, model facts, network, clients, ...).
    type: dict
    default: {}
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Keep the load test and make its records
  prima.cluster.bench_server_record:
    plan: "{{ serve_plan }}"
    result: "{{ bench_load }}"
    raw_dir: "{{ bench_raw_dir }}"
    meta:
      run_id: "{{ bench_run_id }}"
      link: unshaped
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
records:
  description: The records, sequential requests first, then one per concurrency level.
  type: list
  elements: dict
  returned: when every measured sequential request succeeded
raw:
  description: Where the load test's requests were written.
  type: str
  returned: when the load test's result was usable
judged:
  description: The judged.json written beside them.
  type: str
  returned: when every measured sequential request succeeded
run_dir:
  description: The run directory (the parent of C(raw_dir)).
  type: str
  returned: when every measured sequential request succeeded
"""
