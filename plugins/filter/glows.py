"""Filters of the glows_rental role; the logic is in plugin_utils/glows/rental.py."""

import json
import secrets
from typing import Any, Dict, List, Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.glows import rental as glows_rental


def glows_transport_ports(cluster_network: str, world: Any, bases: Mapping[str, Any]) -> List[Dict[str, int]]:
    """The ports each rented instance exports for the cluster transport (22 alone unless direct)."""
    return glows_rental.transport_ports(str(cluster_network), int(world),
                                        {key: int(value) for key, value in bases.items()})


def glows_rental_prefix(given: Any, rental_file_text: Any, state: str = "present", rental_file: str = "") -> str:
    """-e prefix first, then the rental file's (a re-run continues the same rental), else a new random one when
    renting. A rental file that is no record is an error: read as "no rental" it would start a second rental,
    or release nothing, while the first one runs on."""
    if given:
        return str(given)
    if rental_file_text:
        try:
            record = json.loads(rental_file_text)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("prefix"), str) or not record["prefix"]:
            raise AnsibleFilterError("the rental file %s is not a rental record (a JSON object with a prefix); fix or "
                                     "remove it, or give -e prefix=NAME (the instances it named may still run: see "
                                     "the Glows console)" % rental_file)
        return record["prefix"]
    if state == "absent":
        raise AnsibleFilterError("nothing to release: no -e prefix=NAME and no rental file %s" % rental_file)
    return glows_rental.new_prefix(secrets.token_hex(4))


def glows_prefix_problems(prefix: Any) -> List[str]:
    return glows_rental.prefix_problems(prefix)


class FilterModule:
    def filters(self):
        return {"glows_transport_ports": glows_transport_ports, "glows_rental_prefix": glows_rental_prefix,
                "glows_prefix_problems": glows_prefix_problems}
