"""Filters of the transport role (direct or SSH port forwards between nodes); the logic is in
plugin_utils/transport/connections.py."""

import re
from typing import Any, Dict, List, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import (
    PortBases, authorized_key_line, choose, forward_argv, forward_endpoint, forward_user_problems, known_hosts_name,
    needed_ports, network_problems, port_problems, probe_targets, rank_links, setup_state_argv, shell_argv,
    sshd_check_argv, sshd_match_block, sshd_problems, sshd_settings, ssh_endpoint)


def _bases(bases: Mapping[str, Any]) -> PortBases:
    return PortBases(data=int(bases["data"]), signal=int(bases["signal"]), rpc=int(bases["rpc"]),
                     fanout=int(bases["fanout"]))


def needs(ranks: Mapping[str, Any], bases: Mapping[str, Any], allocator: bool = False) -> Dict[str, Any]:
    return needed_ports(ranks, _bases(bases), bool(allocator))


def problems(ranks: Mapping[str, Any], bases: Mapping[str, Any], allocator: bool = False) -> List[str]:
    return port_problems(ranks, _bases(bases), bool(allocator))


def decide(setting: str, hosts: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, str]:
    """The transport, from each host's registered direct probe (transport_probe)."""
    probes = {host: hostvars[host].get("transport_probe") or {} for host in hosts}
    try:
        return choose(str(setting), list(hosts), hostvars, probes)
    except ValueError as error:
        raise AnsibleFilterError(str(error))


def authorized_lines(needs_table: Mapping[str, Any], host: str, hostvars: Mapping[str, Any]) -> List[str]:
    """This host's authorized_keys lines: each peer's cluster key, for the ports that peer needs here."""
    lines = []
    for peer in sorted(needs_table):
        ports = needs_table[peer].get(host) or []
        if peer == host or not ports:
            continue
        try:
            lines.append(authorized_key_line(str(hostvars[peer]["transport_public_key"]), ports,
                                             "prima-cluster@%s" % re.sub(r"[^A-Za-z0-9._-]", "_", peer)))
        except ValueError as error:
            raise AnsibleFilterError("host %s: %s" % (peer, error))
    return lines


def links(needs_table: Mapping[str, Any], host: str, hostvars: Mapping[str, Any], bases: Mapping[str, Any],
          options: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """This host's forwarders: `rank-<peer>` for the ranks and the probe, `fanout-<peer>` for the weights."""
    result = []
    try:
        for kind, table in (("rank", rank_links(needs_table, _bases(bases)).get(host, {})),
                            ("fanout", {peer: [int(bases["fanout"])] for peer in needs_table.get(host, {})})):
            for peer, ports in sorted(table.items()):
                if not ports:
                    continue
                endpoint = forward_endpoint(hostvars, peer, str(options["user"]))
                argv = forward_argv(endpoint, ports, options["key"], options["known_hosts"],
                                    int(options["alive_interval_s"]), int(options["alive_count"]))
                # The name is a file name on the node: nothing of the host name but letters, digits, . _ -
                name = "%s-%s" % (kind, re.sub(r"[^A-Za-z0-9._-]", "_", peer))
                result.append({"name": name, "kind": kind, "peer": peer, "ports": ports,
                               "endpoint": "%s:%d" % (endpoint["host"], endpoint["port"]), "command": shell_argv(argv)})
    except ValueError as error:
        raise AnsibleFilterError(str(error))
    return result


def known_hosts(hosts: Sequence[str], host: str, hostvars: Mapping[str, Any]) -> List[str]:
    """known_hosts lines for this host's peers, under the address this host reaches each one on."""
    try:
        return ["%s %s" % (known_hosts_name(ssh_endpoint(hostvars, peer)),
                           " ".join(str(hostvars[peer]["transport_host_key"]).split()[:2]))
                for peer in sorted(hosts) if peer != host]
    except ValueError as error:
        raise AnsibleFilterError(str(error))


def sshd_match(user: str) -> str:
    try:
        return sshd_match_block(str(user))
    except ValueError as error:
        raise AnsibleFilterError(str(error))


def setup_state(user: str, paths: Sequence[str]) -> List[str]:
    try:
        return setup_state_argv(str(user), [str(path) for path in paths])
    except ValueError as error:
        raise AnsibleFilterError(str(error))


def sshd_first(text: str, keyword: str, default: str = "") -> str:
    """One setting of `sshd -T` output (its first value)."""
    return (sshd_settings(str(text)).get(keyword.lower()) or [default])[0]


class FilterModule:
    def filters(self):
        return {
            "transport_needs": needs,
            "transport_port_problems": problems,
            "transport_network_problems": network_problems,
            "transport_probe_targets": probe_targets,
            "transport_decide": decide,
            "transport_authorized_lines": authorized_lines,
            "transport_links": links,
            "transport_known_hosts": known_hosts,
            "transport_user_problems": forward_user_problems,
            "transport_sshd_match": sshd_match,
            "transport_sshd_check_argv": sshd_check_argv,
            "transport_sshd_problems": sshd_problems,
            "transport_sshd_setting": sshd_first,
            "transport_setup_state_argv": setup_state,
        }
