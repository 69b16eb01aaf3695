"""Filters of the launch role's planner and of its templates' escaping; the logic is in plugin_utils/launch/plan.py,
launch/escaping.py and launch/node_shell.py."""

from typing import Any, Dict, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.escaping import (
    c_escaped, systemd_executable, systemd_file_url, systemd_text)
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.node_shell import ranks_at_work_function
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import (LaunchOptions, cluster_nodes,
                                                                                host_units, launch_plans, plan_name,
                                                                                plan_names, rank_hosts, weights_path)


def plans(nodes: Sequence[Mapping[str, Any]], runtimes: Sequence[str], models: Sequence[str],
          catalog: Mapping[str, Any], options: Mapping[str, Any]) -> Dict[str, Any]:
    """Every unit to render; `options` are the launch role's values, typed here once (LaunchOptions)."""
    try:
        return launch_plans(nodes, runtimes, models, catalog, LaunchOptions.from_mapping(options))
    except ValueError as error:
        raise AnsibleFilterError("launch: %s" % error)


class FilterModule:
    def filters(self):
        return {
            "launch_rank_hosts": rank_hosts,
            "launch_weights_path": weights_path,
            "launch_cluster_nodes": cluster_nodes,
            "launch_plans": plans,
            "launch_plan_name": plan_name,
            "launch_plan_names": plan_names,
            "launch_host_units": host_units,
            # For the templates (roles/launch/templates): a value in a comment, a unit setting, ExecStart's executable.
            "launch_c_escaped": c_escaped,
            "launch_systemd_text": systemd_text,
            "launch_systemd_executable": systemd_executable,
            "launch_systemd_file_url": systemd_file_url,
            # For the link guard and the SSH forwarders: is a rank of this node at work?
            "launch_ranks_at_work_function": ranks_at_work_function,
        }
