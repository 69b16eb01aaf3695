"""Filters of the glows_rental role; the logic is in plugin_utils/glowsrent.py."""

import json
import secrets
from typing import Any, Dict, List, Mapping

from ansible_collections.prima.cluster.plugins.plugin_utils import glowsrent


def glows_transport_ports(cluster_network: str, world: Any, bases: Mapping[str, Any]) -> List[Dict[str, int]]:
    """The ports each rented instance exports for the cluster transport (22 alone unless direct)."""
    return glowsrent.transport_ports(str(cluster_network), int(world), {key: int(value) for key, value in bases.items()})


def glows_rental_prefix(given: Any, rental_file_text: Any) -> str:
    """-e prefix first, then the rental file's (a re-run continues the same rental), else a new random one."""
    if given:
        return str(given)
    try:
        record = json.loads(rental_file_text) if rental_file_text else {}
    except ValueError:
        record = {}
    if isinstance(record, dict) and isinstance(record.get("prefix"), str) and record["prefix"]:
        return record["prefix"]
    return glowsrent.new_prefix(secrets.token_hex(4))


def glows_prefix_problems(prefix: Any) -> List[str]:
    return glowsrent.prefix_problems(prefix)


class FilterModule:
    def filters(self):
        return {"glows_transport_ports": glows_transport_ports, "glows_rental_prefix": glows_rental_prefix,
                "glows_prefix_problems": glows_prefix_problems}
