"""Filters of the serve role; the logic is in plugin_utils/serve/supervision.py."""

from typing import Any, Callable, Dict

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.serve import supervision


def _raising(function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (KeyError, TypeError, ValueError) as error:
            raise AnsibleFilterError("serve: %s" % error)
    wrapped.__doc__ = function.__doc__
    return wrapped


class FilterModule:
    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "serve_settings_problems": _raising(supervision.settings_problems),
            "serve_api_key_problems": _raising(supervision.api_key_problems),
            "serve_supervisor_config": _raising(supervision.supervisor_config),
            "serve_peer_units": _raising(supervision.peer_units),
            "serve_known_hosts": _raising(supervision.known_hosts),
            "serve_status_lines": _raising(supervision.status_lines),
            "serve_reach": _raising(supervision.reach),
            "serve_openai_endpoints": _raising(supervision.openai_endpoints),
            "serve_exit_meaning": _raising(supervision.exit_meaning),
        }
