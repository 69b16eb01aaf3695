"""Lookup plugin: this run's ansible-playbook command line, for hints that must work pasted as printed."""

DOCUMENTATION = r"""
name: rerun_command
short_description: The ansible-playbook line that runs this playbook again with other -e values
description:
  - The playbooks of the running command line, with its inventories (C(-i)), limit and vault options, and the
    terms as the new arguments (like C(-e state=status)) instead of this run's C(-e) values, shell-quoted.
  - For the hints a playbook prints (serve.yml's status and stop). Pasted in the directory the run was started
    from, they reach the same cluster.
options:
  _terms:
    description: The arguments to add, each one shell word (C(-e), C(state=status)).
    type: list
    elements: str
  playbook:
    description: Another playbook of the collection (C(serve.yml)) to name instead, beside this run's.
    type: str
    default: ""
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Say how to stop the server
  ansible.builtin.debug:
    msg: "{{ lookup('prima.cluster.rerun_command', '-e', 'state=stopped') }}"
"""

RETURN = r"""
_raw:
  description: The command line, one string.
  type: list
  elements: str
"""

from ansible import context
from ansible.plugins.lookup import LookupBase

from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.extra_vars import rerun_command


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [rerun_command(context.CLIARGS, [str(term) for term in terms], str(kwargs.get("playbook") or ""))]
