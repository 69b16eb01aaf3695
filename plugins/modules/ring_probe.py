#!/usr/bin/python
"""Ansible module: listen on this rank's ports and reach the peers' ports, all nodes at once."""

DOCUMENTATION = r"""
---
module: ring_probe
short_description: Check that a rank's ports are free and that it reaches its peers' ports
description:
  - Listens on C(ports) at C(address) (a port in use fails at once, naming it) while connecting
    to every C(targets) entry, retrying until C(timeout_s). Run it on every rank in the same
    task, so each rank's temporary listener answers the others' checks; no rank process is needed.
  - Reports the TCP handshake time to each target, the peers that connected to each port,
    and fails naming every target it could not reach.
options:
  address:
    description: This node's cluster address, where its rank listens.
    type: str
    required: true
  ports:
    description: Ports this rank listens on during a run.
    type: list
    elements: int
    default: []
  targets:
    description: host:port strings this rank connects to during a run.
    type: list
    elements: str
    default: []
  expect:
    description: Connections each port waits for from peers before the probe ends early.
    type: int
    default: 0
  expect_per_port:
    description: Connections a port waits for, by port, where more than C(expect) peers reach it.
    type: dict
  timeout_s:
    description: Seconds to wait for the peers' listeners and connections.
    type: float
    default: 10
  payload_bytes:
    description: Bytes sent to each target after connecting (its listener reads them and answers),
      to measure throughput; 0 checks reachability only.
    type: int
    default: 0
author: prima-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ports free here, next rank's ports reachable
  prima.cluster.ring_probe:
    address: 10.77.0.11
    ports: [9001, 10001]
    targets: [10.77.0.12:9002, 10.77.0.12:10002]
    expect: 1
"""

RETURN = r"""
rtt_ms:
  description: TCP handshake time per reached target, in milliseconds.
  type: dict
  returned: always
accepted:
  description: Peer addresses that connected, per listened port.
  type: dict
  returned: always
throughput_mbit_s:
  description: Decimal megabits per second of the payload to each target (with C(payload_bytes)).
  type: dict
  returned: always
missing_peers:
  description: Ports that got fewer than C(expect) connections (a peer could not reach this node).
  type: list
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.prima.cluster.plugins.module_utils.ring_probe import ProbeError, probe


def parse_target(text):
    host, dummy, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ProbeError("target %r is not host:port" % text)
    return host, int(port)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            address=dict(type="str", required=True),
            ports=dict(type="list", elements="int", default=[]),
            targets=dict(type="list", elements="str", default=[]),
            expect=dict(type="int", default=0),
            expect_per_port=dict(type="dict"),
            timeout_s=dict(type="float", default=10.0),
            payload_bytes=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        targets = [parse_target(text) for text in params["targets"]]
        result = probe(params["address"], params["ports"], targets, params["expect"], params["timeout_s"],
                       params["payload_bytes"], params["expect_per_port"])
    except ProbeError as err:
        module.fail_json(msg=str(err))
    if result["unreached"]:
        module.fail_json(msg="cannot reach %s from %s within %gs: check the peer is up and no firewall drops "
                             "the port" % (", ".join("%s (%s)" % item for item in sorted(result["unreached"].items())),
                                           params["address"], params["timeout_s"]), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
