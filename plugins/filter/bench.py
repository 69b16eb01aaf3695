"""Filters of bench.yml's checks across ranks; the logic is in plugin_utils/bench/checks.py."""

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.checks import (
    agreement_problems, build_commit, link_shaping, model_files, network, probe_payload_bytes, probe_spec, rank_reports,
    tunnel_drops)


class FilterModule:
    def filters(self):
        return {
            "bench_agreement_problems": agreement_problems,
            "bench_build_commit": build_commit,
            "bench_probe_spec": probe_spec,
            "bench_rank_reports": rank_reports,
            "bench_network": network,
            "bench_probe_payload_bytes": probe_payload_bytes,
            "bench_link_shaping": link_shaping,
            "bench_model_files": model_files,
            "bench_tunnel_drops": tunnel_drops,
        }
