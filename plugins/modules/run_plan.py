# The action plugin plugins/action/run_plan.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: run_plan
short_description: The run of bench.yml or serve.yml, computed once from the command line and the inventory
description:
  - Checks every value of the command line that the playbook takes and fails naming each problem and its fix
    (C(bench.yml input needs fixing:), C(serve.yml input needs fixing:)), before any node is touched.
  - Chooses what the run does, once, with the functions of plugin_utils/cluster/run_plan.py; the plays after it
    take their parameters from the fact it sets and choose nothing again.
  - "C(playbook=bench) sets C(bench_run): C(models), C(runtimes), C(plan_names) (the launch planner's names, in
    the order the units run), C(runs), C(mode), C(clients), C(link_steps), C(notices)."
  - "C(playbook=serve) sets C(serve_run): C(state), C(starts), C(model), C(runtime), C(unit) (the server unit's
    name)."
options:
  playbook:
    description: Which playbook's run.
    type: str
    choices: [bench, serve]
    required: true
  model:
    description: "-e model: catalog keys, comma-separated (serve: one)."
    type: raw
  runtime:
    description: "-e runtime: bench, a comma list or all (default prima); serve, one runtime (default prima)."
    type: raw
  runs:
    description: "-e runs (bench): measured runs per unit, default 3."
    type: raw
  links:
    description: "-e links (bench): the link sweep, like 1gbit,2.5gbit:2ms; none, the network as it is."
    type: raw
  mode:
    description: "-e mode (bench): run (default) or server."
    type: raw
  clients:
    description: "-e clients (bench, mode=server): the concurrency sweep, default 1,2,4."
    type: raw
  state:
    description: "-e state (serve): started (default), stopped, restarted or status."
    type: raw
  catalog:
    description: The model catalog (cluster_catalog).
    type: dict
    required: true
  prima_built:
    description: Whether prima.cpp is built on this cluster (prima_enabled).
    type: bool
    required: true
  api_key:
    description: The servers' API key (vault_serve_api_key), checked when a server starts.
    type: raw
  hosts:
    description: "The cluster's hosts (bench: their glows_price_cent is checked)."
    type: list
    elements: str
    default: []
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Plan the run
  prima.cluster.run_plan:
    playbook: bench
    model: "{{ model | default(omit) }}"
    runtime: "{{ runtime | default(omit) }}"
    catalog: "{{ cluster_catalog }}"
    prima_built: true
    hosts: "{{ groups['cluster'] }}"
"""

RETURN = r"""
run:
  description: The run (also set as the fact bench_run or serve_run).
  type: dict
  returned: success
"""
