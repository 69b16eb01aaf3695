#!/usr/bin/python
"""Ansible module: one sandbox node up (fresh from the pristine root) or gone."""

DOCUMENTATION = r"""
---
module: sandbox_node
short_description: A sandbox node, a network namespace with its own root filesystem and sshd
description:
  - With C(state=present) the node is removed if anything of it is left, then made anew
    from the pristine root filesystem, so every run starts from a fresh node.
  - With C(state=absent) its processes are stopped, its mounts, namespace and veth removed
    and its root filesystem deleted.
  - Runs on the controller as root.
options:
  name:
    description: Node name (the inventory host name).
    type: str
    required: true
  state:
    description: present or absent.
    type: str
    choices: [present, absent]
    default: present
  nodes_dir:
    description: Directory that holds the nodes' root filesystems.
    type: path
    required: true
  pristine:
    description: Pristine root filesystem copied for the node.
    type: path
  address:
    description: The node's address on the bridge (its cluster_ip).
    type: str
  prefix_len:
    description: Prefix length of the bridge network.
    type: int
    default: 24
  bridge:
    description: Host bridge the node is attached to.
    type: str
  gateway:
    description: The host's address on the bridge.
    type: str
  authorized_key:
    description: Public key allowed to log in as root.
    type: str
  binds:
    description: Host directories bind-mounted into the node (src, dest, readonly).
    type: list
    elements: dict
    default: []
  service_argv:
    description:
      - Instead of a node with its own root and sshd, a namespace that runs this host
        program (the sandbox's hub). C(pristine) and C(authorized_key) are then not used.
    type: list
    elements: str
  service_log:
    description: Where the service's output goes.
    type: path
  router:
    description:
      - Instead of a node, a namespace that only forwards packets (the access gateway of the mapped
        topology, whose nftables rules the sandbox role writes).
    type: bool
    default: false
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start node n0
  prima.cluster.sandbox_node:
    name: n0
    nodes_dir: /var/lib/prima-sandbox/nodes
    pristine: /var/cache/prima-sandbox/pristine
    address: 10.77.0.10
    bridge: psb0
    gateway: 10.77.0.1
    authorized_key: "{{ lookup('file', '/var/lib/prima-sandbox/ssh/id_ed25519.pub') }}"
"""

RETURN = r"""
removed:
  description: Whether leftovers of the node were removed first.
  type: bool
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.prima.cluster.plugins.module_utils.sandbox_node import Node, SandboxError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            nodes_dir=dict(type="path", required=True),
            pristine=dict(type="path"),
            address=dict(type="str"),
            prefix_len=dict(type="int", default=24),
            bridge=dict(type="str"),
            gateway=dict(type="str"),
            authorized_key=dict(type="str", no_log=False),
            binds=dict(type="list", elements="dict", default=[]),
            service_argv=dict(type="list", elements="str"),
            service_log=dict(type="path"),
            router=dict(type="bool", default=False),
        ),
        required_if=[("state", "present", ("address", "bridge", "gateway"))],
        supports_check_mode=True,
    )
    params = module.params
    try:
        node = Node(params["name"], params["nodes_dir"])
        if module.check_mode:
            module.exit_json(changed=params["state"] == "present" or node.exists(), removed=False)
        removed = node.destroy()
        if params["state"] == "present" and params["router"]:
            node.create_router(params["address"], params["prefix_len"], params["bridge"], params["gateway"])
            module.exit_json(changed=True, removed=removed)
        if params["state"] == "present" and params["service_argv"]:
            pid = node.create_service(params["address"], params["prefix_len"], params["bridge"], params["gateway"],
                                      params["service_argv"], params["service_log"] or "/dev/null")
            module.exit_json(changed=True, removed=removed, pid=pid)
        if params["state"] == "present":
            if not params["pristine"] or not params["authorized_key"]:
                module.fail_json(msg="sandbox node %s: a node needs pristine and authorized_key" % params["name"])
            node.create(params["pristine"], params["address"], params["prefix_len"], params["bridge"],
                        params["gateway"], params["authorized_key"], params["binds"])
            module.exit_json(changed=True, removed=removed)
        module.exit_json(changed=removed, removed=removed)
    except SandboxError as error:
        module.fail_json(msg="sandbox node %s: %s" % (params["name"], error))


if __name__ == "__main__":
    main()
