#!/usr/bin/python
"""Ansible module: ask the hub what each file is (commit, sha256, size) before downloading it."""

DOCUMENTATION = r"""
---
module: hub_metadata
short_description: Read the commit, sha256 and size the Hugging Face hub gives for files
description:
  - For each file, a HEAD of its resolve URL without following the redirect to the CDN,
    reading C(X-Repo-Commit), C(X-Linked-Etag) and C(X-Linked-Size).
  - Changes nothing.
options:
  files:
    description: Files to ask about.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: File name (the key of the answer).
        type: str
        required: true
      url:
        description: Its resolve URL at the revision or commit it is fetched from.
        type: str
        required: true
      revision_url:
        description: Its resolve URL at the catalog's revision, when the lock holds it to a commit; its commit is
          returned as C(revision_commit), to say when the revision moved on.
        type: str
  token:
    description: Bearer token (Hugging Face hub token); sent to the hub's own host only.
    type: str
    default: ""
  timeout:
    description: Seconds to wait for each answer.
    type: int
    default: 30
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ask the hub
  prima.cluster.hub_metadata:
    files:
      - name: qwq-32b-q4_k_m.gguf
        url: https://huggingface.co/Qwen/QwQ-32B-GGUF/resolve/main/qwq-32b-q4_k_m.gguf
"""

RETURN = r"""
files:
  description: By file name, C(commit), C(sha256) (null without LFS), C(size), C(lfs) and C(revision_commit).
  type: dict
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.prima.cluster.plugins.module_utils.hub_metadata import HubError, head


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="list", elements="dict", required=True, options=dict(
                name=dict(type="str", required=True),
                url=dict(type="str", required=True),
                revision_url=dict(type="str"),
            )),
            token=dict(type="str", default="", no_log=True),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    token = module.params["token"] or None
    answers, errors = {}, []
    for spec in module.params["files"]:
        try:
            answer = head(spec["url"], token, module.params["timeout"])
            if spec.get("revision_url"):
                answer["revision_commit"] = head(spec["revision_url"], token, module.params["timeout"])["commit"]
            answers[spec["name"]] = answer
        except HubError as error:
            errors.append(str(error))
    if errors:
        module.fail_json(msg="The hub could not say what the weights are, so nothing was downloaded: "
                             + "; ".join(errors), files=answers)
    module.exit_json(changed=False, files=answers)


if __name__ == "__main__":
    main()
