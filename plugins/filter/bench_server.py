"""Filters of bench.yml -e mode=server; the logic is in plugin_utils/bench/server.py."""

from typing import Any, List, Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.server import (
    client_address, clients_problems, clients_where, ctx_size, parse_clients, server_bound_s)


def clients(value: Any) -> List[int]:
    """The client counts of the concurrency sweep, from -e clients=1,2,4 (default 1,2,4)."""
    try:
        return parse_clients(value)
    except ValueError as error:
        raise AnsibleFilterError("bench_server_clients: %s" % error) from None


def bound_s(spec: Mapping[str, Any]) -> int:
    """The cluster lock's bound of a mode=server bench, from a dict of server_bound_s's arguments."""
    try:
        return server_bound_s(**spec)
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError("bench_server_bound_s: %s" % error) from None


class FilterModule:
    def filters(self):
        return {
            "bench_server_clients": clients,
            "bench_server_clients_problems": clients_problems,
            "bench_server_ctx_size": ctx_size,
            "bench_server_bound_s": bound_s,
            "bench_server_address": client_address,
            "bench_server_clients_where": clients_where,
        }
