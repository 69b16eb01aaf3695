"""Aggregate measured runs and lay them out as markdown tables (pure functions, standard library)."""

import fcntl
import json
import math
import os
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.cost import (PRICE_FIELD, mtok_cell, price_cell,
                                                                               record_prices, report_cost, usd_per_mtok)
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.estimate import (
    Key, boundary_costs, expectations, expected_cell, ratio_text, sweep_series)
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.load_test import load_table
from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.paths import REPORT_TEMPLATE

RUNTIME_TITLES = {"prima": "prima.cpp", "llama_rpc": "llama.cpp RPC", "single": "single node"}
Number = Optional[float]


def summarize(values: Sequence[Any]) -> Dict[str, Any]:
    """n, median, min, max and sample stddev of the numbers among `values` (None and inf skipped)."""
    numbers = [float(value) for value in values
               if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)]
    if not numbers:
        return {"n": 0, "median": None, "min": None, "max": None, "stddev": None}
    return {"n": len(numbers), "median": statistics.median(numbers), "min": min(numbers), "max": max(numbers),
            "stddev": statistics.stdev(numbers) if len(numbers) > 1 else 0.0}


def derived(perf: Mapping[str, Any]) -> Dict[str, Number]:
    """ms per generated token, and time to first token: prompt eval plus one token."""
    eval_ms, runs, prompt_ms = perf.get("eval_ms"), perf.get("eval_runs"), perf.get("prompt_ms")
    ms_per_token = eval_ms / runs if eval_ms is not None and runs else None
    ttft = prompt_ms + ms_per_token if prompt_ms is not None and ms_per_token is not None else None
    return {"ms_per_token": ms_per_token, "ttft_ms": ttft}


def result_line(record: Mapping[str, Any]) -> Dict[str, Any]:
    """One results.jsonl object: the run's record with the derived figures beside the parsed ones (and what
    a million generated tokens cost at this run's rate on its nodes, usd_per_mtok; None without every price)."""
    line = dict(record)
    if record.get("mode") == LOAD_MODE:
        # A concurrency level: what a million tokens cost when the server is that busy, at its aggregate rate.
        tps = record.get("aggregate_tps")
        line["usd_per_mtok"] = usd_per_mtok(record_prices(record), 1000.0 / tps if tps else None)
        return line
    line.update(derived(record.get("perf") or {}))
    line["usd_per_mtok"] = usd_per_mtok(record_prices(record), line["ms_per_token"])
    return line


# bench.yml -e mode=server: a record per concurrency level (bench/server.py), beside the sequential
# requests' records of mode "server", which the main table takes as it takes mode=run's runs.
LOAD_MODE = "server-load"


def is_level(record: Mapping[str, Any]) -> bool:
    return record.get("mode") == LOAD_MODE


# Summarized per row; results_line puts the derived ones (ms_per_token, ttft_ms) beside the parsed perf figures.
METRICS = ("prompt_tps", "eval_tps", "ms_per_token", "ttft_ms", "prompt_ms")


def aggregate(records: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """One row per runtime x model x link over the measured (not warm-up) runs, in first-seen order."""
    groups = {}  # type: Dict[Tuple[str, str, str], List[Mapping[str, Any]]]
    for record in records:
        if record.get("warmup") or is_level(record):
            continue
        groups.setdefault((record["runtime"], record["model"], record.get("link", "")), []).append(record)
    rows = []
    for (runtime, model, link), runs in groups.items():
        lines = [result_line(run) for run in runs]
        row = {"runtime": runtime, "model": model, "link": link, "runs": len(runs), "world": runs[0]["world"],
               "split": runs[0].get("split", ""), "build": runs[0].get("build", ""),
               "hosts": runs[0].get("hosts", []), "prompt_tokens": (runs[0].get("perf") or {}).get("prompt_tokens"),
               # What the estimate beside this row needs: the step's link, its probe, the model's header.
               "link_bits": int(runs[0].get("link_bits") or 0), "link_shaping": runs[0].get("link_shaping") or {},
               "network": runs[0].get("network") or [], "base_network": runs[0].get("base_network") or [],
               "link_delay_ms": runs[0].get("link_delay_ms") or 0.0, "model_facts": runs[0].get("model_facts") or {},
               "transport": transport_mode(runs[0])}
        for metric in METRICS:
            row[metric] = summarize([line.get(metric, (line.get("perf") or {}).get(metric)) for line in lines])
        row[PRICE_FIELD] = record_prices(runs[0])
        row["usd_per_mtok"] = usd_per_mtok(row[PRICE_FIELD], row["ms_per_token"]["median"])
        rows.append(row)
    return rows


def transport_mode(record: Mapping[str, Any]) -> str:
    """direct or ssh: how this run's ranks reached each other (records from before the transport: unknown)."""
    return str((record.get("transport") or {}).get("mode") or "—")


def transport_notes(records: Sequence[Mapping[str, Any]]) -> List[str]:
    """Each transport the runs used, and why it was picked."""
    notes = []  # type: List[str]
    for record in records:
        transport = record.get("transport") or {}
        note = "%s: %s" % (transport.get("mode"), transport.get("reason")) if transport.get("mode") else ""
        if note and note not in notes:
            notes.append(note)
        if transport.get("mode") == "ssh" and record.get("link_bits"):
            shaped = ("through SSH, each sweep step shaped the interface of each node's default route, which "
                      "carries its SSH traffic to the peers")
            if shaped not in notes:
                notes.append(shaped)
    return notes


def _fmt(value: Number, digits: int = 2) -> str:
    return "—" if value is None else "%.*f" % (digits, value)


def spread(summary: Mapping[str, Any], digits: int = 2) -> str:
    if not summary or summary.get("median") is None:
        return "—"
    return "%s ± %s" % (_fmt(summary["median"], digits), _fmt(summary["stddev"], digits))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for dummy in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def results_table(rows: Sequence[Mapping[str, Any]], expected: Optional[Mapping[Key, Mapping[str, Any]]] = None) -> str:
    """(a) runtime x model x link: prompt and decode t/s, ms per token, time to first token, dollars per
    million generated tokens, and the estimate's decode beside the measured one."""
    expected = expected if expected is not None else expectations(rows)
    headers = ["Runtime", "Model", "Link", "Transport", "World", "Split", "Build", "Prompt t/s", "Decode t/s",
               "ms/token", "TTFT ms", "$/Mtok", "Runs", "Expected decode t/s", "Measured/expected"]
    body = []
    for row in rows:
        guess = expected.get((row["runtime"], row["model"], row["link"]), {})
        body.append([RUNTIME_TITLES.get(row["runtime"], row["runtime"]), row["model"], row["link"],
                     row.get("transport", "—"), row["world"],
                     row["split"], row["build"], spread(row["prompt_tps"]), spread(row["eval_tps"]),
                     spread(row["ms_per_token"]), spread(row["ttft_ms"], 1), mtok_cell(row), row["runs"],
                     expected_cell(guess, "decode_tps"), ratio_text(guess.get("decode_tps_ratio"))])
    return markdown_table(headers, body)


def sweep_table(rows: Sequence[Mapping[str, Any]], expected: Mapping[Key, Mapping[str, Any]]) -> str:
    """The page's table, measured: per link step, decode and prefill t/s with the estimate and the ratio."""
    headers = ["Runtime", "Model", "Link", "Decode (t/s)", "Prefill (t/s)", "Expected decode", "Measured/expected",
               "Expected prefill", "Measured/expected", "ms per boundary, measured / expected", "Fitted decode",
               "Measured/fitted"]
    costs = boundary_costs(rows)
    body = []
    for series in sweep_series(rows):
        for row in series["rows"]:
            key = (row["runtime"], row["model"], row["link"])
            guess, cost = expected.get(key, {}), costs.get(key, {})
            body.append([RUNTIME_TITLES.get(row["runtime"], row["runtime"]), row["model"], link_title(row),
                         spread(row["eval_tps"]),
                         spread(row["prompt_tps"]), expected_cell(guess, "decode_tps"),
                         ratio_text(guess.get("decode_tps_ratio")), expected_cell(guess, "prompt_tps"),
                         ratio_text(guess.get("prompt_tps_ratio")),
                         "%s / %s" % (_fmt(cost.get("measured_ms"), 3), _fmt(cost.get("expected_ms"), 3)) if cost else "—",
                         ("%s (fit)" if cost.get("is_fit") else "%s") % _fmt(cost.get("fitted_decode_tps")) if cost else "—",
                         ratio_text(cost.get("fitted_ratio"))])
    return markdown_table(headers, body) if body else ""


def link_title(row: Mapping[str, Any]) -> str:
    shaping = row.get("link_shaping") or {}
    if not shaping.get("shaped"):
        return "%s (not shaped)" % row["link"]
    if float(row.get("link_delay_ms") or 0) > 0 and not shaping.get("delay_applied"):
        return "%s (rate only, no delay)" % row["link"]
    return row["link"]


def sweep_notices(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    notices = []  # type: List[str]
    for row in rows:
        for notice in (row.get("link_shaping") or {}).get("notices") or []:
            line = "%s: %s" % (row["link"], notice)
            if line not in notices:
                notices.append(line)
    return notices


def runtimes_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """(b) the runtimes side by side on the same nodes: ms per token (decode t/s), per model and link."""
    runtimes = [runtime for runtime in RUNTIME_TITLES if any(row["runtime"] == runtime for row in rows)]
    keyed = {(row["model"], row["link"], row["runtime"]): row for row in rows}
    pairs = []  # type: List[Tuple[str, str]]
    for row in rows:
        if (row["model"], row["link"]) not in pairs:
            pairs.append((row["model"], row["link"]))
    body = []
    for model, link in pairs:
        cells = [model, link]
        for runtime in runtimes:
            row = keyed.get((model, link, runtime))
            cells.append("%s ms (%s t/s)" % (_fmt(row["ms_per_token"]["median"]), _fmt(row["eval_tps"]["median"]))
                         if row else "—")
        body.append(cells)
    return markdown_table(["Model", "Link"] + [RUNTIME_TITLES[runtime] for runtime in runtimes], body)


PROFILE_ROWS = (("gpu", "GPU", None), ("vram_gib", "VRAM (GiB)", 1), ("ram_gib", "RAM (GiB)", 1),
                ("disk_read_gbs", "Disk read (GB/s)", 2), ("cpu_cores", "CPU cores", None))


def profile_table(nodes: Sequence[Mapping[str, Any]], price: bool = False) -> str:
    """(c) the cluster profile, one column per rank; with `price`, each node's price in $/h."""
    headers = ["Property"] + ["Rank %s (%s)" % (node["rank"], node["host"]) for node in nodes]
    body = []
    for key, title, digits in PROFILE_ROWS:
        cells = []
        for node in nodes:
            value = node.get(key)
            if value in (None, ""):
                cells.append("—")
            else:
                cells.append(_fmt(float(value), digits) if digits is not None else str(value))
        body.append([title] + cells)
    if price:
        body.append(["Price ($/h)"] + [price_cell(node.get(PRICE_FIELD)) for node in nodes])
    return markdown_table(headers, body)


def runs_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Every run, warm-ups included, with its own figures and the split each rank really used."""
    headers = ["Unit", "Link", "Run", "Prompt tokens", "Prompt t/s", "Decode runs", "Decode t/s", "Total ms",
               "Ranks used"]
    body = []
    for record in records:
        if is_level(record):
            continue
        perf = record.get("perf") or {}
        used = ", ".join("r%s %s" % (rank["rank"], "removed" if rank["removed"] else "lw %s ngl %s" % (
            rank["window"], rank["gpu_layers"])) for rank in record.get("ranks", [])) or "—"
        label = "warm-up %s" % record.get("run_index") if record.get("warmup") else "run %s" % record.get("run_index")
        body.append([record["unit"], record.get("link", ""), label, _fmt(perf.get("prompt_tokens"), 0),
                     _fmt(perf.get("prompt_tps")),
                     _fmt(perf.get("eval_runs"), 0), _fmt(perf.get("eval_tps")), _fmt(perf.get("total_ms")), used])
    return markdown_table(headers, body)


def _target(row: Mapping[str, Any]) -> str:
    """The peer and port; through SSH the address is this node's own forward, so the peer is named."""
    if row.get("peer") and row.get("via") == "ssh":
        return "%s:%s via ssh (%s)" % (row["peer"], row["target"].rsplit(":", 1)[-1], row["target"])
    return row["target"]


def network_table(rows: Sequence[Mapping[str, Any]], link: Optional[str] = None) -> str:
    """Each rank to each address it connects to: TCP handshake time and payload throughput
    (with the link each probe ran on, for a sweep)."""
    body = [([link] if link is not None else []) + [row["host"], _target(row), _fmt(row.get("rtt_ms"), 3),
                                                    _fmt(row.get("mbit_s"), 1)] for row in rows]
    return markdown_table((["Link"] if link is not None else []) + ["From", "To", "Round trip ms", "Throughput Mbit/s"],
                          body)


def networks_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The probe before the runs, and on a sweep the probe of each shaped step."""
    if not records or not records[0].get("network"):
        return ""
    if not any(record.get("link_bits") for record in records):
        return network_table(records[0]["network"])
    probes = [("as it is", records[0].get("base_network") or [])]
    for record in records:
        if record.get("link") not in [link for link, dummy in probes]:
            probes.append((record["link"], record.get("network") or []))
    tables = [network_table(rows, link) for link, rows in probes if rows]
    return "\n".join([tables[0]] + ["\n".join(table.splitlines()[2:]) for table in tables[1:]])


def report_context(records: Sequence[Mapping[str, Any]], profile: Sequence[Mapping[str, Any]],
                   repeated: Sequence[Mapping[str, Any]] = (), plots: Sequence[Mapping[str, str]] = ()) -> Dict[str, Any]:
    rows = aggregate(records)
    expected = expectations(rows)
    return {
        "repeated": list(repeated),
        "sweep_table": sweep_table(rows, expected),
        "sweep_notices": sweep_notices(rows),
        "plots": list(plots),
        "run_id": records[0]["run_id"] if records else "",
        "finished": records[-1].get("finished", "") if records else "",
        "results_table": results_table(rows, expected),
        "runtimes_table": runtimes_table(rows),
        "profile_table": profile_table(profile, price=True) if profile else "",
        "cost_line": report_cost(records, profile),
        "device_profile_table": next((profile_table(record["device_profile"]) for record in reversed(records)
                                      if record.get("device_profile")), ""),
        "runs_table": runs_table(records),
        "load_tables": load_tables(records),
        "server_timings": any(record.get("mode") == "server" for record in records),
        "network_table": networks_table(records),
        "transport_notes": transport_notes(records),
        "rows": rows,
    }


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def load_tables(records: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """mode=server: per runtime x model x link, its concurrency levels as a table (load_test.load_table), with
    where the clients ran and what each of them asked."""
    groups = {}  # type: Dict[Tuple[str, str, str], List[Mapping[str, Any]]]
    for record in records:
        if is_level(record):
            groups.setdefault((record["runtime"], record["model"], record.get("link", "")), []).append(record)
    tables = []
    for (runtime, model, link), levels in groups.items():
        first = levels[0]
        server = first.get("server") or {}
        asked = "each client sends %s streamed request(s) one after another (prompt %s, %s tokens)" % (
            first.get("requests_per_client", "—"), json.dumps(first.get("prompt", "")), first.get("max_tokens", "—"))
        slots = " to llama-server with %s slots and a context of %s tokens" % (
            server.get("parallel", "—"), server.get("ctx_size", "—")) if server else ""
        tables.append({"runtime": runtime, "model": model, "link": link,
                       "title": "%s, %s, %s" % (RUNTIME_TITLES.get(runtime, runtime), model, link),
                       "where": "%s; %s%s." % (
                           _sentence(first.get("clients_where") or "clients: where, not recorded"), asked, slots),
                       "errors": sorted({sample for level in levels for sample in level.get("error_samples") or []}),
                       "table": load_table(levels)})
    return tables


def append_results(path: str, records: Sequence[Mapping[str, Any]]) -> int:
    """Append one JSON line per measured run; earlier lines stay as they are."""
    measured = [result_line(record) for record in records if not record.get("warmup")]
    # allow_nan=False: NaN and Infinity are not JSON; every figure was checked (perflog), this makes sure. All
    # lines are made before any is written, so that a refused one leaves the file as it was.
    lines = [json.dumps(line, sort_keys=True, allow_nan=False) + "\n" for line in measured]
    with open(path, "a+b") as handle:
        # Two runs ending at once never interleave their lines; a last line left without its newline (an edit by
        # hand) gets one, so that the first new line is not glued to it.
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0, os.SEEK_END)
        if handle.tell() > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                lines.insert(0, "\n")
        handle.write("".join(lines).encode("utf-8"))
    return len(measured)


def render_report(records: Sequence[Mapping[str, Any]], profile: Sequence[Mapping[str, Any]],
                  repeated: Sequence[Mapping[str, Any]] = (), template: Optional[str] = None,
                  plot_dir: Optional[str] = None, report_dir: Optional[str] = None) -> Tuple[str, str]:
    """report.md from roles/bench/templates/report.md.j2, and the main table for the console. With plot_dir, a
    sweep's plots are drawn there (PNG, matplotlib) and linked from the report (relative to report_dir,
    plot_dir itself when unset)."""
    import jinja2  # the controller's; the rest of this module is standard library

    plots = []  # type: List[Dict[str, str]]
    if plot_dir:
        from ansible_collections.prima.cluster.plugins.plugin_utils.bench.plot import plot_all

        rows = aggregate(records)
        drawn = [series for series in sweep_series(rows) if len(series["rows"]) > 1]
        if drawn:
            os.makedirs(plot_dir, exist_ok=True)
        plots = plot_all(plot_dir, drawn, rows)
        for plot in plots:
            plot["name"] = os.path.relpath(os.path.join(plot_dir, plot["name"]), report_dir or plot_dir)

    path = template or REPORT_TEMPLATE
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    context = report_context(records, profile, repeated, plots)
    text = jinja2.Environment(keep_trailing_newline=True, trim_blocks=True,
                              undefined=jinja2.StrictUndefined).from_string(source)
    return text.render(**context), context["results_table"]
