"""bench.yml -e mode=server on the controller: its input, the server's context and the lock's bound
(plugin_utils/bench/server.py and its filters), the records of one load test (the action bench_server_record),
and what the report and results.jsonl make of them (bench/report.py, the bench_report callback)."""

import json
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail, AnsibleFilterError
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import action_loader

from ansible_collections.prima.cluster.plugins.filter.bench_server import FilterModule
from ansible_collections.prima.cluster.plugins.plugin_utils.bench import server as bench_server
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.records import write_report
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.report import (
    aggregate, append_results, load_tables, render_report, result_line, runs_table)

PLAN = {"name": "serve-llama_rpc-tiny", "runtime": "llama_rpc", "model": "tiny", "world": 3,
        "hosts": ["n0", "n1", "n2"], "split": "-ts 1,1,1", "head": "n0",
        "server": {"bind": "127.0.0.1", "port": 8080, "parallel": 2}}
TIMINGS = {"prompt_n": 12, "prompt_ms": 30.0, "prompt_per_second": 400.0, "predicted_n": 32,
           "predicted_ms": 640.0, "predicted_per_second": 50.0}
META = {"run_id": "r1", "link": "unshaped", "link_bits": 0, "build": "0c1e570", "run_dir": "/tmp/r1",
        "bench_started": "2026-12-02T12:00:00Z", "finished": "2026-12-02T12:10:00Z",
        "price_cent_per_hour": {"n0": 65, "n1": 65, "n2": 65}, "transport": {"mode": "ssh", "reason": "auto"},
        "server": {"bind": "127.0.0.1", "port": 8080, "parallel": 2, "ctx_size": 2048}, "prompt": "Once upon a time",
        "max_tokens": 32, "requests_per_client": 2, "clients_host": "n0",
        "clients_where": "clients on rank 0 (n0) over loopback (127.0.0.1:8080)"}


def chunk(text=None, **extra):
    delta = {"content": text} if text is not None else {"role": "assistant"}
    return dict({"choices": [{"index": 0, "delta": delta}]}, **extra)


def streamed(sent, gaps, error=None, status=200):
    """A load client's record: the role chunk, one content chunk per gap (seconds), the final chunk."""
    arrivals, now = [[sent + 0.001, chunk()]], sent + 0.001
    for gap in gaps:
        now += gap
        arrivals.append([now, chunk("w")])
    arrivals.append([now + 0.001, chunk("", timings=TIMINGS)])
    return {"sent": sent, "done": now + 0.002, "status": status, "arrivals": arrivals, "dropped": 0, "error": error}


def load_result(level_errors=()):
    """What prima.cluster.load_test returns: a warm-up and two measured requests, then 1 and 2 clients."""
    sequential = [dict({"sent": 1.0 + index, "done": 1.7 + index, "status": 200, "timings": TIMINGS,
                        "usage": {"completion_tokens": 32}, "error": None}, warmup=index == 0) for index in range(3)]
    one = [streamed(10.0, [0.1, 0.02, 0.02]), streamed(10.2, [0.1, 0.02, 0.02])]
    two = [streamed(20.0, [0.2, 0.04, 0.04]), streamed(20.0, [0.3, 0.04, 0.04]),
           streamed(20.4, [0.2, 0.04]), streamed(20.4, [0.2, 0.04], error=(level_errors or [None])[0])]
    return {"changed": False, "sequential": sequential,
            "levels": [{"clients": 1, "wall_s": 0.5, "requests": one}, {"clients": 2, "wall_s": 1.0, "requests": two}]}


def test_clients_problems_name_the_variable_and_the_fix():
    assert bench_server.clients_problems("1,2,4") == [] and bench_server.clients_problems([1, 8]) == []
    assert bench_server.clients_problems(" 3 ") == []
    for bad in ("0", "1,-2", "a", "1,,2", "1.5", [0], ""):
        assert bench_server.clients_problems(bad) == [
            "clients '%s' is not a comma list of whole numbers >= 1; pass -e clients=1,2,4" % bad]


def test_parse_clients_keeps_the_order_once_each_and_defaults():
    assert bench_server.parse_clients("4,1,4,2") == [4, 1, 2]
    assert bench_server.parse_clients("") == [1, 2, 4] and bench_server.parse_clients(None) == [1, 2, 4]
    assert bench_server.parse_clients([2, "3"]) == [2, 3]
    with pytest.raises(ValueError, match="clients '1,x'"):
        bench_server.parse_clients("1,x")


def test_ctx_size_gives_every_slot_a_prompt_and_its_answer():
    assert bench_server.ctx_size(1, "Once upon a time", 32) == 2048
    assert bench_server.ctx_size(8, "Once upon a time", 32) == 8 * 512
    # A long answer: each slot holds it, the prompt (a token per character at worst) and the chat template.
    assert bench_server.ctx_size(4, "x" * 100, 1000) == 4 * (1000 + 100 + 128)


def test_server_bound_counts_every_request_to_its_timeout():
    bound = bench_server.server_bound_s(steps=2, plans=3, warmup_runs=1, runs=3, clients=[1, 2, 4],
                                        requests_per_client=2, request_timeout_s=600, listen_timeout_s=600,
                                        load_timeout_s=1800, stop_grace_s=10)
    # Per unit and step: up (600 + 1800), 4 sequential + 3 levels x 2 requests at 600 s, stop 20, overhead 120.
    assert bound == 1800 + 2 * 3 * (2400 + 10 * 600 + 20 + 120)
    # No sweep given (an unshaped step): one step.
    assert bench_server.server_bound_s(0, 1, 0, 1, [], 2, 10, 1, 1, 0, overhead_s=0, unit_overhead_s=0) == 12


def test_clients_reach_a_server_on_any_address_through_the_loopback():
    assert bench_server.client_address("0.0.0.0") == "127.0.0.1" and bench_server.client_address("") == "127.0.0.1"
    assert bench_server.client_address("10.77.0.10") == "10.77.0.10"
    assert bench_server.clients_where("n0", "127.0.0.1", 8080) == \
        "clients on rank 0 (n0) over loopback (127.0.0.1:8080)"
    assert bench_server.clients_where("n0", "10.77.0.10", 80) == \
        "clients on rank 0 (n0) over the network (10.77.0.10:80)"


def test_sequential_records_carry_the_servers_timings_as_a_runs_perf():
    records = bench_server.sequential_records(PLAN, load_result(), META)
    assert [(record["run_index"], record["warmup"]) for record in records] == [(0, True), (1, False), (2, False)]
    first = records[1]
    assert first["mode"] == "server" and first["unit"] == "serve-llama_rpc-tiny" and first["world"] == 3
    assert first["hosts"] == ["n0", "n1", "n2"] and first["split"] == "-ts 1,1,1" and first["run_id"] == "r1"
    assert first["perf"]["prompt_tokens"] == 12 and first["perf"]["eval_tps"] == 50.0
    assert first["perf"]["eval_runs"] == 32 and first["perf"]["total_ms"] is None
    assert first["request"] == {"status": 200, "wall_ms": pytest.approx(700.0), "usage": {"completion_tokens": 32},
                                "error": None}
    # The keys of a mode=run run's perf (parse_perf), so the medians and the main table take it as it is.
    from ansible_collections.prima.cluster.plugins.plugin_utils.bench.perflog import PERF_KEYS
    assert sorted(first["perf"]) == sorted(key for key in PERF_KEYS if key != "file")


def test_level_records_summarize_each_concurrency_level():
    one, two = bench_server.level_records(PLAN, load_result(["HTTP 503: busy"]), META)
    assert one["mode"] == "server-load" and one["clients"] == 1 and one["requests"] == 2 and one["errors"] == 0
    assert one["tokens"] == 6 and one["aggregate_tps"] == pytest.approx(12.0)
    assert one["ttft_p50_ms"] == pytest.approx(101.0) and one["itl_p50_ms"] == pytest.approx(20.0)
    assert two["errors"] == 1 and two["error_samples"] == ["HTTP 503: busy"] and two["requests"] == 4
    assert two["tokens"] == 3 + 3 + 2 and two["ttft_p99_ms"] <= 301.0 and two["dropped_events"] == 0
    assert one["clients_where"] == META["clients_where"] and one["hosts"] == PLAN["hosts"]
    assert "perf" not in one


def test_sequential_problems_name_each_failed_measured_request():
    result = load_result()
    result["sequential"][0]["error"] = "warm-up failures do not count"
    assert bench_server.sequential_problems(PLAN, result) == []
    result["sequential"][2]["error"] = "HTTP 401: Invalid API Key"
    assert bench_server.sequential_problems(PLAN, result) == [
        "serve-llama_rpc-tiny request 2: HTTP 401: Invalid API Key"]
    assert bench_server.sequential_problems(PLAN, {"sequential": []}) == [
        "serve-llama_rpc-tiny: no measured request in the load test's result"]


def test_raw_result_keeps_the_requests_only():
    assert bench_server.raw_result(dict(load_result(), invocation={"module_args": {"api_key": "x"}})).keys() == {
        "sequential", "levels"}


def test_filters():
    filters = FilterModule().filters()
    assert filters["bench_server_clients"]("2,1") == [2, 1]
    with pytest.raises(AnsibleFilterError, match="bench_server_clients: clients 'x'"):
        filters["bench_server_clients"]("x")
    assert filters["bench_server_ctx_size"](2, "hi", 32) == 2048
    assert filters["bench_server_bound_s"]({"steps": 1, "plans": 1, "warmup_runs": 0, "runs": 1, "clients": [1],
                                            "requests_per_client": 1, "request_timeout_s": 1, "listen_timeout_s": 0,
                                            "load_timeout_s": 0, "stop_grace_s": 0}) == 1800 + 2 + 120
    with pytest.raises(AnsibleFilterError, match="bench_server_bound_s"):
        filters["bench_server_bound_s"]({"steps": 1})


def action(args):
    """The action plugin as Ansible's loader gives it, with the task's arguments."""
    task = mock.MagicMock(args=args, async_val=0, check_mode=False, diff=False)
    return action_loader.get("prima.cluster.bench_server_record", task=task, connection=mock.MagicMock(),
                             play_context=PlayContext(), loader=mock.MagicMock(), templar=mock.MagicMock(),
                             shared_loader_obj=None)


def test_the_action_keeps_the_raw_requests_and_sets_the_records(tmp_path):
    result = action({"plan": PLAN, "result": load_result(), "raw_dir": str(tmp_path), "meta": META}).run(task_vars={})
    path = tmp_path / "n0" / "serve-llama_rpc-tiny" / "unshaped" / "load.json"
    assert result["raw"] == str(path) and json.loads(path.read_text()) == bench_server.raw_result(load_result())
    records = result["records"]
    assert [record["mode"] for record in records] == ["server"] * 3 + ["server-load"] * 2
    assert records == bench_server.server_records(PLAN, load_result(), META)
    assert result["judged"] == str(path.parent / "judged.json") and "ansible_facts" not in result


def test_the_action_fails_on_a_failed_load_test_or_measured_request_and_keeps_the_requests(tmp_path):
    hidden = {"failed": True, "msg": "load_test: runs must be 1 or more, not 0"}
    with pytest.raises(AnsibleActionFail, match="serve-llama_rpc-tiny: the load test failed: load_test: runs must"):
        action({"plan": PLAN, "result": hidden, "raw_dir": str(tmp_path), "meta": META}).run(task_vars={})
    failed = load_result()
    failed["sequential"][1]["error"] = "ConnectionRefusedError: [Errno 111] Connection refused"
    with pytest.raises(AnsibleActionFail, match=r"request 1: ConnectionRefusedError.*\n\(requests kept in .*load.json"):
        action({"plan": PLAN, "result": failed, "raw_dir": str(tmp_path), "meta": META}).run(task_vars={})
    assert (tmp_path / "n0" / "serve-llama_rpc-tiny" / "unshaped" / "load.json").exists()
    with pytest.raises(AnsibleActionFail, match="plan lacks head"):
        action({"plan": {key: value for key, value in PLAN.items() if key != "head"}, "result": load_result(),
                "raw_dir": str(tmp_path), "meta": META}).run(task_vars={})


def test_results_lines_and_tables_of_a_server_bench(tmp_path):
    records = bench_server.server_records(PLAN, load_result(), META)
    # Only the measured sequential requests make the main table's row; the levels have tables of their own.
    [row] = aggregate(records)
    assert row["runs"] == 2 and row["eval_tps"]["median"] == 50.0 and row["ms_per_token"]["median"] == 20.0
    assert "server-load" not in runs_table(records) and runs_table(records).count("serve-llama_rpc-tiny") == 3
    [table] = load_tables(records)
    assert table["title"] == "llama.cpp RPC, tiny, unshaped"
    assert table["where"] == ('Clients on rank 0 (n0) over loopback (127.0.0.1:8080); each client sends 2 streamed '
                              'request(s) one after another (prompt "Once upon a time", 32 tokens) to llama-server '
                              'with 2 slots and a context of 2048 tokens.')
    assert table["table"].splitlines()[2].startswith("| 1 | 2 | 101.0 / ")
    assert append_results(str(tmp_path / "results.jsonl"), records) == 4
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [line["mode"] for line in lines] == ["server", "server", "server-load", "server-load"]
    # A level's $/Mtok is at its aggregate rate: $1.95/h for three nodes at 12 t/s.
    assert lines[2]["usd_per_mtok"] == pytest.approx(1.95 / 3600 / 12.0 * 1e6)
    assert lines[0]["usd_per_mtok"] == pytest.approx(1.95 / 3600 * 0.020 * 1e6)
    assert result_line(records[1])["ttft_ms"] == pytest.approx(30.0 + 20.0)


def test_the_report_of_a_server_bench_has_the_load_table_and_says_where_the_figures_come_from():
    records = bench_server.server_records(PLAN, load_result(["HTTP 503: busy"]), META)
    text, main = render_report(records, [])
    assert "come from the server's own `timings`" in text
    assert "## Under load: concurrent clients of the server" in text and "### llama.cpp RPC, tiny, unshaped" in text
    assert "Clients on rank 0 (n0) over loopback (127.0.0.1:8080)" in text
    assert "| Clients | Requests | TTFT ms p50 / p95 / p99 | ITL ms p50 / p95 / p99 | Aggregate t/s | Errors |" in text
    assert "\nError: HTTP 503: busy\n" in text and "| llama.cpp RPC | tiny | unshaped | ssh | 3 |" in main
    # mode=run's report has neither.
    run_text, dummy = render_report([dict(records[1], mode="run")], [])
    assert "Under load" not in run_text and "own `timings`" not in run_text


def test_the_report_of_a_server_bench_is_made_from_its_run_directory(tmp_path):
    run_dir = tmp_path / "r1"
    action({"plan": PLAN, "result": load_result(), "raw_dir": str(run_dir / "raw"),
            "meta": dict(META, run_dir=str(run_dir))}).run(task_vars={})
    write_report(str(run_dir), str(run_dir / "report.md"), str(tmp_path / "results.jsonl"))
    modes = [json.loads(line)["mode"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert modes == ["server", "server", "server-load", "server-load"]
    assert "### llama.cpp RPC, tiny, unshaped" in (run_dir / "report.md").read_text()


def refuse(literal):
    raise AssertionError("%s is not JSON" % literal)


def hostile_result():
    """What a server may put in its answers: NaN, infinities, objects and booleans where figures belong."""
    result = load_result()
    result["sequential"][1].update(timings=dict(TIMINGS, predicted_per_second=float("nan"), prompt_ms=float("inf")),
                                   usage={"prompt_tokens": float("nan"), "completion_tokens": {"a": [1]}})
    result["sequential"][2]["usage"] = {"prompt_tokens": float("-inf"), "completion_tokens": True}
    result["levels"][0]["wall_s"] = float("inf")
    result["levels"][1]["requests"][0]["arrivals"][-1][1]["timings"] = {"predicted_per_second": float("nan")}
    return result


def test_nan_infinity_and_objects_from_a_server_are_no_figures_and_never_reach_the_files(tmp_path):
    records = bench_server.server_records(PLAN, hostile_result(), META)
    assert records[1]["perf"]["eval_tps"] is None and records[1]["perf"]["prompt_ms"] is None
    assert records[1]["perf"]["eval_runs"] == 32
    assert records[1]["request"]["usage"] == {"prompt_tokens": None, "completion_tokens": None}
    assert records[2]["request"]["usage"] == {"prompt_tokens": None, "completion_tokens": None}
    assert records[3]["wall_s"] is None and records[3]["aggregate_tps"] is None and records[3]["tokens"] == 6
    path = tmp_path / "results.jsonl"
    assert append_results(str(path), records) == 4
    assert [json.loads(line, parse_constant=refuse)["mode"] for line in path.read_text().splitlines()] == [
        "server", "server", "server-load", "server-load"]
    action({"plan": PLAN, "result": hostile_result(), "raw_dir": str(tmp_path), "meta": META}).run(task_vars={})
    raw = json.loads((tmp_path / "n0" / "serve-llama_rpc-tiny" / "unshaped" / "load.json").read_text(),
                     parse_constant=refuse)
    # Kept as measured, but as JSON can hold it: what is not a number is null.
    assert raw["sequential"][1]["timings"]["predicted_per_second"] is None and raw["levels"][0]["wall_s"] is None
    assert raw["sequential"][1]["timings"]["predicted_n"] == 32


def test_results_lines_refuse_what_json_cannot_hold_and_leave_the_file_as_it_was(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"earlier": 1}\n')
    records = bench_server.server_records(PLAN, load_result(), META)
    with pytest.raises(ValueError):
        append_results(str(path), records + [dict(records[1], unchecked=float("nan"))])
    assert path.read_text() == '{"earlier": 1}\n'
