"""Filters of the link role and of bench.yml's sweeps; the logic is in plugin_utils/link/shaping.py."""

from typing import Any, Dict, List, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.link.shaping import (
    interface_with, links_problems, parse_links, route_source, shaping_result, step_commands)


def link_steps(value: Any) -> List[Dict[str, Any]]:
    try:
        return parse_links(value)
    except ValueError as error:
        raise AnsibleFilterError(str(error))


def link_interface_with(address: str, ip_output: str) -> str:
    return interface_with(str(address), ip_output) or ""


def link_shaping_commands(device: str, step: Mapping[str, Any], with_delay: bool) -> List[List[str]]:
    return step_commands(device, step, bool(with_delay))


def link_shaping_result(results: Sequence[Mapping[str, Any]], rate_only: Sequence[Mapping[str, Any]],
                        step: Mapping[str, Any]) -> Dict[str, Any]:
    # Skipped loop items carry no rc: they did not run.
    rate_only = [result for result in rate_only if "rc" in result]
    return shaping_result(results, rate_only, step)


class FilterModule:
    def filters(self):
        return {
            "link_route_source": route_source,
            "link_steps": link_steps,
            "link_steps_problems": links_problems,
            "link_interface_with": link_interface_with,
            "link_shaping_commands": link_shaping_commands,
            "link_shaping_result": link_shaping_result,
        }
