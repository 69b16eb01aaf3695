"""Filters of the preflight's inventory checks; the logic is in plugin_utils/preflight/checks.py."""

from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import (
    choice_problems, cluster_problems, cluster_ranks, layer_window_problems, positive_int_problems, rank_env_problems,
    role_argument_specs, role_input_problems, runtimes_problems, runtimes_selection, stall_problems)


class FilterModule:
    def filters(self):
        return {
            "cluster_ranks": cluster_ranks,
            "cluster_problems": cluster_problems,
            "role_input_problems": role_input_problems,
            "role_argument_specs": role_argument_specs,
            "choice_problems": choice_problems,
            "positive_int_problems": positive_int_problems,
            "layer_window_problems": layer_window_problems,
            "rank_env_problems": rank_env_problems,
            "stall_problems": stall_problems,
            "runtimes_problems": runtimes_problems,
            "runtimes_selection": runtimes_selection,
        }
