# The action plugin plugins/action/bench_model_facts.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: bench_model_facts
short_description: Read each model's facts from the GGUF header of its weights on a node
description:
  - Copies the first C(header_mib) MiB of each model's first weights file on the node (dd), fetches them to the
    controller, reads layers, widths, heads and context length with the gguf library, and removes the copies.
  - Sets the fact C(bench_model_facts), by model; the estimates beside every measurement use it.
  - A header that is damaged, or cut short on the node, fails the task with one line naming the model, its file
    and what is wrong (for example C(truncated at offset N)); one longer than C(header_mib) asks for a larger value.
options:
  models:
    description: By model key, C(path) of the first weights file on the node, its C(size) and the C(total) of every part
      (C(prima.cluster.bench_model_files) gives them).
    type: dict
    required: true
  header_mib:
    description: MiB copied from the start of each file; a large tokenizer needs more than one.
    type: int
    default: 16
  remote_dir:
    description: Directory on the node for the temporary copy.
    type: path
    required: true
requirements:
  - the gguf Python library on the controller
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read each model's facts from the GGUF header of its weights
  prima.cluster.bench_model_facts:
    models: "{{ bench_plans | prima.cluster.bench_model_files(cluster_catalog, cluster_models_dir) }}"
    remote_dir: /var/lib/prima-bench
  delegate_to: n0
  run_once: true
"""

RETURN = r"""
ansible_facts:
  description: C(bench_model_facts), by model, as plugin_utils/models/gguf_header.py's model_facts gives them.
  type: dict
  returned: success
"""
