"""The link sweep's plot: decode and prefill t/s against link rate, measured points over the estimate's line."""

import os
from typing import Any, Dict, List, Mapping, Sequence

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.estimate import curve_rates, expected_curve

RUNTIME_TITLES = {"prima": "prima.cpp", "llama_rpc": "llama.cpp RPC"}


def plot_sweep(path: str, series: Mapping[str, Any], all_rows: Sequence[Mapping[str, Any]]) -> None:
    """One PNG for one runtime x model: two panels (decode, prefill), log-scaled link rate."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = series["rows"]
    rates = [row["link_bits"] / 1e9 for row in rows]
    curve = expected_curve(all_rows, series["runtime"], series["model"], curve_rates(rows))
    figure, panels = pyplot.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for panel, metric, title in ((panels[0], "eval_tps", "Decode"), (panels[1], "prompt_tps", "Prefill")):
        measured = [row[metric]["median"] for row in rows]
        errors = [row[metric]["stddev"] or 0.0 for row in rows]
        panel.errorbar(rates, measured, yerr=errors, fmt="o", capsize=3, label="measured (median ± stddev)")
        expected_key = "decode_tps" if metric == "eval_tps" else "prompt_tps"
        line = [(point["rate_gbit"], point[expected_key]) for point in curve if point.get(expected_key)]
        if line:
            panel.plot([x for x, dummy in line], [y for dummy, y in line], "-", label="estimate")
        panel.set_xscale("log")
        panel.set_xlabel("link rate (Gbit/s)")
        panel.set_ylabel("%s (tokens/s)" % title.lower())
        panel.set_title("%s: %s, %s" % (title, RUNTIME_TITLES.get(series["runtime"], series["runtime"]),
                                        series["model"]))
        panel.set_ylim(bottom=0)
        panel.grid(True, which="both", alpha=0.3)
        panel.legend()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def plot_name(series: Mapping[str, Any]) -> str:
    return "sweep-%s-%s.png" % (series["runtime"], series["model"])


def plot_all(directory: str, all_series: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, str]]:
    made = []
    for series in all_series:
        name = plot_name(series)
        plot_sweep(os.path.join(directory, name), series, rows)
        made.append({"name": name, "title": "%s, %s" % (RUNTIME_TITLES.get(series["runtime"], series["runtime"]),
                                                        series["model"])})
    return made
