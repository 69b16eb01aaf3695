# The action plugin plugins/action/models_wait.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: models_wait
short_description: Wait for an async weights download, printing its progress
description:
  - Polls an async job (the C(prima.cluster.hub_download) module started with C(async) and C(poll=0)) and, every
    C(interval) seconds, prints the bytes, percent and rate that the download keeps in C(progress_file).
  - Returns the job's result once it finished, and fails when the job is lost or takes longer than C(timeout).
options:
  jid:
    description: The async job id (C(ansible_job_id) of the started task).
    type: str
    required: true
  progress_file:
    description: The JSON file the download keeps up to date, on the node.
    type: str
    required: true
  interval:
    description: Seconds between progress lines.
    type: int
    default: 30
  timeout:
    description: Seconds to wait at most.
    type: int
    default: 86400
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for the file, printing progress
  prima.cluster.models_wait:
    jid: "{{ models_job.ansible_job_id }}"
    progress_file: /opt/models/.tiny.gguf.progress
    interval: 30
"""

RETURN = r"""
sha256:
  description: The digest of the installed file (from the download's result).
  type: str
  returned: success
"""
