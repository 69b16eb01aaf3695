"""Lookup plugin: the root password of Glows instances, read fresh from the API for the first contact."""

DOCUMENTATION = r"""
name: glows_ssh_password
short_description: The SSH password Glows gives an instance, from a fresh query
description:
  - Queries the Glows SDK API for each instance id and returns its C(sshCred.password), the root password of a
    fresh instance, so the first contact (playbooks/glows-keys.yml) can install a key without the password ever
    being written down. The inventory plugin M(prima.cluster.glows) keeps it out of the inventory and its cache.
  - Use it only in a task with C(no_log) set; the value is a secret.
  - Fails with one line naming the instance when the API has no password for it.
options:
  _terms:
    description: Instance ids (C(instanceID), like C(ins-boyqp4g8); the inventory's C(glows_instance_id)).
    required: true
    type: list
    elements: str
  api_url:
    description: Base URL of the Glows SDK API.
    type: str
    default: https://a.glows.ai/sdk/v1
    env:
      - name: GLOWS_API_URL
  token:
    description: The Glows SDK token.
    type: str
    env:
      - name: GLOWS_SDK_TOKEN
  timeout_s:
    description: Seconds one call of the API may take in all, connecting and reading the whole answer.
    type: float
    default: 30.0
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Log in with the password Glows gave the instance
  ansible.builtin.set_fact:
    ansible_password: "{{ lookup('prima.cluster.glows_ssh_password', glows_instance_id, api_url=glows_api_url) }}"
  no_log: true
"""

RETURN = r"""
_raw:
  description: One password per term.
  type: list
  elements: str
"""

from ansible.errors import AnsibleLookupError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.lookup import LookupBase

from ansible_collections.prima.cluster.plugins.plugin_utils.glows.api import GlowsClient, GlowsError


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        token = self.get_option("token")
        token = to_text(token).strip() if token is not None else ""
        if not token:
            raise AnsibleLookupError("prima.cluster.glows_ssh_password has no token: set GLOWS_SDK_TOKEN")
        try:
            client = GlowsClient(self.get_option("api_url"), token, timeout_s=self.get_option("timeout_s"))
            passwords = []
            for term in terms:
                instance = client.query(request_id=str(term))
                credentials = instance.get("sshCred")
                password = credentials.get("password") if isinstance(credentials, dict) else None
                if not isinstance(password, str) or not password:
                    raise GlowsError("instance %s (metaKey %s) has no SSH password in its sshCred: log in with a key, "
                                     "or set vault_glows_root_password" % (term, instance.get("metaKey") or "?"))
                passwords.append(password)
        except GlowsError as error:
            raise AnsibleLookupError(str(error))
        return passwords
