"""The overhead per measured run of both bench modes, from a run's records and raw files."""

import json

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import overhead as bench_overhead


def test_run_mode_counts_every_head_run_and_divides_by_the_measured_ones(tmp_path):
    raw = tmp_path / "raw"
    for unit in ("llama_rpc-tiny", "single-tiny"):
        for label, seconds in (("warmup0", "3.5"), ("run1", "2.0"), ("run2", "2.5"), ("run2-retry1", "1.0")):
            (raw / "n0" / unit / "unshaped" / label).mkdir(parents=True)
            (raw / "n0" / unit / "unshaped" / label / "wall_s").write_text(seconds + "\n")
        # A worker's wall time is not the head's.
        (raw / "n1" / unit / "unshaped" / "run1").mkdir(parents=True)
        (raw / "n1" / unit / "unshaped" / "run1" / "wall_s").write_text("99\n")
    results = tmp_path / "results.jsonl"
    records = [{"run_id": "r", "mode": "run", "unit": unit, "hosts": ["n0", "n1"], "runtime": unit.split("-", maxsplit=1)[0]}
               for unit in ("llama_rpc-tiny", "single-tiny") for dummy in range(2)]
    results.write_text("\n".join(json.dumps(record) for record in records + [{"run_id": "other"}]) + "\n")
    read = bench_overhead.read_records(str(results), "r")
    assert len(read) == 4 and bench_overhead.measured_runs(read, "run") == 4
    heads = bench_overhead.run_heads_s(str(raw), read)
    assert heads == 18.0
    figures = bench_overhead.overhead("run", 78.0, heads, 4)
    assert figures["overhead_s_per_run"] == 15.0 and figures["goal_met"] is False


def test_server_mode_takes_each_request_and_level_as_the_client_saw_it(tmp_path):
    load = {"sequential": [{"warmup": True, "sent": 1.0, "done": 1.5}, {"sent": 2.0, "done": 2.25},
                           {"sent": None, "done": 3.0}],
            "levels": [{"clients": 1, "wall_s": 1.0}, {"clients": 2, "wall_s": "x"}]}
    where = tmp_path / "raw" / "n0" / "serve-single-tiny" / "unshaped"
    where.mkdir(parents=True)
    (where / "load.json").write_text(json.dumps(load))
    loads = bench_overhead.load_results(str(tmp_path / "raw"))
    assert bench_overhead.server_heads_s(loads) == 1.75
    records = [{"mode": "server", "warmup": True}, {"mode": "server", "warmup": False}, {"mode": "server-load"}]
    assert bench_overhead.measured_runs(records, "server") == 1
    server = bench_overhead.overhead("server", 4.75, 1.75, 2)
    assert server["overhead_s_per_run"] == 1.5 and server["goal_met"] is True
    run = bench_overhead.overhead("run", 40.0, 10.0, 2)
    assert bench_overhead.ratio([run, server]) == 10.0
    table = bench_overhead.table([run, server])
    assert "| server | 4.8 | 1.8 | 2 | 1.50 | 2.0 (met) |" in table
    assert bench_overhead.overhead("server", 1.0, 0.0, 0)["overhead_s_per_run"] is None
