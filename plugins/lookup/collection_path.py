"""Lookup plugin: absolute paths of files that ship with this collection."""

DOCUMENTATION = r"""
name: collection_path
short_description: Absolute path of a file or directory inside the prima.cluster collection
description:
  - Resolves each term, a path relative to the collection's root (like C(roles/launch/templates)),
    against wherever the collection is installed or checked out, so roles reach the collection's
    shared files (the fan-out file server) without C(role_path/../..).
  - Fails when the path does not exist, or when it leaves the collection.
options:
  _terms:
    description: Paths relative to the collection's root.
    required: true
    type: list
    elements: str
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: The launch templates of this collection
  ansible.builtin.debug:
    msg: "{{ lookup('prima.cluster.collection_path', 'roles/launch/templates') }}"
"""

RETURN = r"""
_raw:
  description: One absolute path per term.
  type: list
  elements: str
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.paths import collection_path


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        paths = []
        for term in terms:
            try:
                path = collection_path(str(term))
            except ValueError as error:
                raise AnsibleLookupError(str(error))
            if not os.path.exists(path):
                raise AnsibleLookupError("%s is not in the prima.cluster collection (%s)" % (term, path))
            paths.append(path)
        return paths
