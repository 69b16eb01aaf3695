#!/usr/bin/python
"""Ansible module: a resumable download whose file appears only once its sha256 is checked."""

DOCUMENTATION = r"""
---
module: hub_download
short_description: Download a large file resumably; install it under its name only after its sha256 is checked
description:
  - Downloads into C(dest).partial, resuming with an HTTP Range and If-Range request where an
    earlier run stopped, retrying on network errors, and moves the file to C(dest) only after
    its size matches C(size) and its sha256 matches C(sha256) (or, with no C(sha256), after a
    complete download). One download per C(dest) at a time (an flock on C(dest).partial.lock).
  - A verified file gets a stamp (size, mtime, ctime, inode, digest); a re-run trusts an
    unchanged stamp instead of hashing the file again. A changed file is hashed; one that
    does not match is removed and downloaded again.
options:
  url:
    description: Where the file is downloaded from.
    type: str
    required: true
  dest:
    description: Final path of the file.
    type: path
    required: true
  sha256:
    description: Expected digest; empty to accept and report the digest of a complete download.
    type: str
    default: ""
  size:
    description: Expected size in bytes; a download of any other size is never installed. 0 when unknown.
    type: int
    default: 0
  digest_source:
    description: Where C(sha256) comes from (catalog, lock, hub, source node), named in errors.
    type: str
    default: ""
  token:
    description: Bearer token (Hugging Face hub token); sent to the hub's own host only, never across a redirect
      to another host, and a redirect from https to http is refused.
    type: str
    default: ""
  retries:
    description: Attempts after the first one, each resuming where the previous stopped.
    type: int
    default: 5
  timeout:
    description: Seconds without data before an attempt is abandoned.
    type: int
    default: 60
  progress_file:
    description: JSON file the module keeps up to date with bytes, total and rate.
    type: path
  verify_only:
    description: Only say whether C(dest) is already a verified copy (C(verified)); change nothing.
    type: bool
    default: false
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fetch a GGUF file
  prima.cluster.hub_download:
    url: https://huggingface.co/Qwen/QwQ-32B-GGUF/resolve/main/qwq-32b-q4_k_m.gguf
    dest: /opt/models/qwq-32b-q4_k_m.gguf
    progress_file: /opt/models/.qwq-32b-q4_k_m.gguf.progress
"""

RETURN = r"""
sha256:
  description: Digest of the installed file.
  type: str
  returned: success
size:
  description: Its size in bytes.
  type: int
  returned: success
verified:
  description: With verify_only, whether dest is already a verified copy.
  type: bool
  returned: verify_only
verified_by:
  description: stamp (unchanged since verified), hash (rehashed local file) or download.
  type: str
  returned: success
downloaded_bytes:
  description: Bytes received in this run.
  type: int
  returned: success
resumed_from:
  description: Offset the download resumed from (0 for a fresh start; null without a download).
  type: int
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.prima.cluster.plugins.module_utils.weights_download import (DownloadError, download_verified,
                                                                                     verify_only)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            sha256=dict(type="str", default=""),
            size=dict(type="int", default=0),
            digest_source=dict(type="str", default=""),
            token=dict(type="str", default="", no_log=True),
            retries=dict(type="int", default=5),
            timeout=dict(type="int", default=60),
            progress_file=dict(type="path"),
            verify_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["verify_only"]:
        module.exit_json(dest=params["dest"], **verify_only(params["dest"], params["sha256"] or None))
    if module.check_mode:
        planned = verify_only(params["dest"], params["sha256"] or None)
        planned["changed"] = not planned["verified"]
        module.exit_json(dest=params["dest"], **planned)
    try:
        result = download_verified(params["url"], params["dest"], params["sha256"] or None,
                                   token=params["token"] or None, retries=params["retries"],
                                   timeout=params["timeout"], progress_path=params["progress_file"],
                                   expected_size=params["size"] or None, digest_source=params["digest_source"])
    except DownloadError as error:
        module.fail_json(msg=str(error), dest=params["dest"])
    except OSError as error:
        module.fail_json(msg="%s: %s; nothing was installed under it" % (params["dest"], error), dest=params["dest"])
    module.exit_json(dest=params["dest"], **result)


if __name__ == "__main__":
    main()
