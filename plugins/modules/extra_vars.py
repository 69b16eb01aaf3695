# The action plugin plugins/action/extra_vars.py does the work; this file documents it.

DOCUMENTATION = r"""
---
module: extra_vars
short_description: Refuse -e values that a playbook would lose, ignore or misread
description:
  - Reads each C(-e) item of the command line as Ansible does (key=value words, JSON/YAML, C(@file)) and fails,
    before any node or API is touched, when
  - a key=value item left words without a name (bash removed the quotes around a value with a space, so
    C(-e gpu='NVIDIA GeForce RTX 4090') arrives as C(gpu=NVIDIA) and three lost words);
  - a name is one the playbook does not take (a typo like C(-e rnus=2) would be ignored);
  - a key=value item gives text to a variable whose type (meta/argument_specs.yml) the role does not convert.
  - Each problem quotes what was typed and the form to type instead. The variables each playbook takes are in
    meta/extra_vars.yml and every role's meta/argument_specs.yml.
  - The playbooks are those the command line names (C(bench.yml), C(prima.cluster.bench)). A playbook that is not
    the collection's (your own, importing these) is checked for lost words and untyped text, not for names.
  - Sets the fact C(extra_vars_checked), so that a playbook imported by another checks once.
options: {}
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the command line's -e values
  prima.cluster.extra_vars:
"""

RETURN = r"""
checked:
  description: How many -e items were read.
  type: int
  returned: success
"""
