"""Filters of bench.yml's cost figures: each node's price (glows_price_cent); the logic is in
plugin_utils/bench/cost.py."""

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.cost import Price, host_prices, price_problems


def prices(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, Optional[Price]]:
    """{host: US cents per hour or None} from each host's glows_price_cent."""
    try:
        return host_prices(hosts, hostvars)
    except ValueError:
        raise AnsibleFilterError("bench_prices: %s" % "; ".join(price_problems(hosts, hostvars))) from None


def problems(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> List[str]:
    """Each host whose glows_price_cent is set but is no price."""
    return price_problems(hosts, hostvars)


class FilterModule:
    def filters(self):
        return {
            "bench_prices": prices,
            "bench_price_problems": problems,
        }
