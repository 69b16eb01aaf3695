"""A bench run's records on disk (plugin_utils/bench/records.py) and the actions that write and read them: the
judging action leaves judged.json beside real logs, and the report and results.jsonl are made from the run
directory alone, the same as from the records the judging made; damaged files are refused, naming them."""

import datetime
import json
import os
import shutil
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import action_loader

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import records as bench_records
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.run import run_record

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PERF = os.path.join(REPO, "tests", "fixtures", "perf")
SINGLE_LOG = os.path.join(PERF, "llamacpp-single-llama-completion.stderr")
PRIMA_LOGS = [os.path.join(PERF, "prima-a_world2-rank%d.stderr" % rank) for rank in (0, 1)]
SINGLE = {"name": "single-tiny", "runtime": "single", "model": "tiny", "world": 1, "hosts": ["n0"],
          "split": "1 node", "head": "n0", "units": {"n0": {"rank": 0, "role": "head"}}}
PRIMA = {"name": "prima-tiny", "runtime": "prima", "model": "tiny", "world": 2, "hosts": ["n0", "n1"],
         "split": "auto", "window": None, "head": "n0",
         "units": {"n0": {"rank": 0, "role": "head"}, "n1": {"rank": 1, "role": "worker"}}}
PROFILE = [{"rank": 0, "host": "n0", "gpu": "", "vram_gib": 0, "ram_gib": 1.0, "disk_read_gbs": 1.5, "cpu_cores": 2}]


def meta(run_dir, index, **extra):
    base = {"run_id": os.path.basename(run_dir), "run_index": index, "warmup": index == 0, "link": "unshaped",
            "link_bits": 0, "run_dir": run_dir, "finished": "2026-12-03T00:00:00Z", "build": "0c1e570"}
    base.update(extra)
    return base


def action(name, args):
    """The action plugin as Ansible's loader gives it, with the task's arguments."""
    task = mock.MagicMock(args=args, async_val=0, check_mode=False, diff=False)
    return action_loader.get(name, task=task, connection=mock.MagicMock(), play_context=PlayContext(),
                             loader=mock.MagicMock(), templar=mock.MagicMock(), shared_loader_obj=None)


def fetched(raw_dir, plan, label, logs):
    """What bench.yml's fetch leaves: each rank's stderr under raw/<host>/<unit>/<label>/."""
    for host, log in zip(plan["hosts"], logs):
        directory = os.path.join(raw_dir, host, plan["name"], label)
        os.makedirs(directory, exist_ok=True)
        shutil.copy(log, os.path.join(directory, "stderr"))


def judge(run_dir, plan, label, logs, index, **extra):
    """One run fetched and judged by the real action; its result."""
    raw_dir = os.path.join(run_dir, "raw")
    fetched(raw_dir, plan, label, logs)
    ranks = [{"host": host, "rank": unit["rank"], "role": unit["role"], "exit": 0 if unit["role"] == "head" else None,
              "state": "running" if unit["role"] == "worker" else "exited", "left": []}
             for host, unit in sorted(plan["units"].items())]
    return action("prima.cluster.bench_record", {
        "plan": plan, "ranks": ranks, "raw_dir": raw_dir, "run_label": label,
        "meta": meta(run_dir, index, **extra)}).run(task_vars={})


@pytest.fixture
def run_dir(tmp_path):
    directory = tmp_path / "reports" / "r1"
    (directory / "raw").mkdir(parents=True)
    (directory / "profile.json").write_text(json.dumps(PROFILE))
    return str(directory)


def test_the_records_read_back_are_those_the_judging_made(run_dir):
    judged = [judge(run_dir, SINGLE, "unshaped/warmup0", [SINGLE_LOG], 0),
              judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1),
              judge(run_dir, PRIMA, "unshaped/run1", PRIMA_LOGS, 1)]
    assert all(result["judged"].endswith("/n0/%s/unshaped/%s/judged.json" % (plan["name"], label))
               for result, plan, label in zip(judged, [SINGLE, SINGLE, PRIMA], ["warmup0", "run1", "run1"]))
    found = bench_records.read_run_dir(run_dir)
    assert found.records == [result["record"] for result in judged]
    assert found.profile == PROFILE and found.repeated == []
    # prima.cpp's record reads every rank's own log, the worker's from under its host.
    assert [rank["window"] for rank in found.records[2]["ranks"]] == [
        rank["window"] for rank in judged[2]["record"]["ranks"]]
    assert found.records[2]["ranks"][1]["host"] == "n1" and found.records[0]["perf"]["eval_tps"] > 0


def test_records_come_back_in_the_order_they_were_judged_whatever_the_paths(run_dir):
    for index, link in enumerate(["zzz", "aaa", "mmm"]):
        judge(run_dir, SINGLE, "%s/run1" % link, [SINGLE_LOG], 1, link=link, run_index=index)
    assert [record["link"] for record in bench_records.read_run_dir(run_dir).records] == ["zzz", "aaa", "mmm"]


def test_a_sweeps_steps_keep_their_own_logs(run_dir):
    """The same run label on two link steps: two directories, two records (one overwrote the other before)."""
    judge(run_dir, SINGLE, "1gbit/run1", [SINGLE_LOG], 1, link="1gbit")
    judge(run_dir, SINGLE, "10gbit/run1", [SINGLE_LOG], 1, link="10gbit")
    assert [record["link"] for record in bench_records.read_run_dir(run_dir).records] == ["1gbit", "10gbit"]


def test_the_figures_are_parsed_again_from_the_raw_logs(run_dir):
    """After a parser fix (or a log replaced by its complete copy), the report follows the log, not the record."""
    result = judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    stderr = os.path.join(os.path.dirname(result["judged"]), "stderr")
    with open(stderr) as handle:
        text = handle.read()
    eval_tps = result["record"]["perf"]["eval_tps"]
    with open(stderr, "w") as handle:
        handle.write(text.replace("%.2f tokens per second" % eval_tps, "%.2f tokens per second" % (eval_tps * 2)))
    assert bench_records.read_run_dir(run_dir).records[0]["perf"]["eval_tps"] == pytest.approx(eval_tps * 2, 0.01)


def test_a_cut_log_tried_again_is_kept_for_the_report(run_dir, tmp_path):
    cut = tmp_path / "cut.stderr"
    with open(SINGLE_LOG) as handle:
        cut.write_text(handle.read().split("common_perf_print")[0])
    result = action("prima.cluster.bench_record", {
        "plan": SINGLE, "raw_dir": os.path.join(run_dir, "raw"), "run_label": "unshaped/run1", "retries": 1,
        "ranks": [{"host": "n0", "rank": 0, "role": "head", "exit": 0}], "meta": meta(run_dir, 1)})
    fetched(os.path.join(run_dir, "raw"), SINGLE, "unshaped/run1", [str(cut)])
    outcome = result.run(task_vars={})
    assert outcome["ansible_facts"] == {"bench_run_attempt": 1}
    judge(run_dir, SINGLE, "unshaped/run1-retry1", [SINGLE_LOG], 1)
    found = bench_records.read_run_dir(run_dir)
    assert len(found.records) == 1 and found.repeated == [outcome["lost"]]
    assert found.repeated[0]["run"] == "unshaped/run1"
    written = bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"))
    with open(written.report) as handle:
        assert "- single-tiny unshaped/run1: `%s`" % outcome["lost"]["stderr"] in handle.read()


def test_the_server_records_read_back_are_those_the_load_test_made(run_dir):
    from test_benchserver import META, PLAN, load_result  # the load test's fixtures

    result = action("prima.cluster.bench_server_record", {
        "plan": PLAN, "result": load_result(), "raw_dir": os.path.join(run_dir, "raw"), "meta": META}).run(
            task_vars={})
    assert result["judged"] == os.path.join(os.path.dirname(result["raw"]), "judged.json")
    assert bench_records.read_run_dir(run_dir).records == result["records"]


def test_write_report_writes_the_report_then_appends_the_measured_runs(run_dir, tmp_path):
    for index in range(3):
        judge(run_dir, SINGLE, "unshaped/%s" % ("warmup0" if index == 0 else "run%d" % index), [SINGLE_LOG], index)
    results = tmp_path / "reports" / "results.jsonl"
    results.write_text('{"earlier": 1}\n')
    written = bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"), str(results))
    lines = results.read_text().splitlines()
    assert lines[0] == '{"earlier": 1}' and len(lines) == 3 and written.appended == 2  # no warm-up
    assert json.loads(lines[1])["ms_per_token"] > 0
    report = (tmp_path / "reports" / "r1" / "report.md").read_text()
    assert "| single node | tiny | unshaped | — | 1 | 1 node | 0c1e570 |" in report and "| Rank 0 (n0) |" in report
    assert written.main_table in report


def test_an_existing_report_is_kept_and_nothing_is_appended(run_dir, tmp_path):
    judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    report = tmp_path / "reports" / "r1" / "report.md"
    report.write_text("kept\n")
    results = tmp_path / "reports" / "results.jsonl"
    with pytest.raises(bench_records.RecordsError, match="report.md exists already and is kept as it is: give another"):
        bench_records.write_report(run_dir, str(report), str(results))
    assert report.read_text() == "kept\n" and not results.exists()


def test_a_run_directory_without_a_judged_run_writes_nothing(run_dir, tmp_path):
    with pytest.raises(bench_records.RecordsError, match="holds no judged run"):
        bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"), str(tmp_path / "results.jsonl"))
    with pytest.raises(bench_records.RecordsError,
                       match="no raw/ here; -e run_dir names the directory of one bench.yml run"):
        bench_records.read_run_dir(str(tmp_path))
    assert not os.path.exists(os.path.join(run_dir, "report.md")) and not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize("damage", [b"", b"{\"kind\": \"run\", \"sequ", os.urandom(512), b"[1, 2]",
                                    b'{"kind": "run", "sequence": 1, "plan": {}, "meta": {}, "ranks": [], '
                                    b'"run_label": "x"}',
                                    b'{"kind": "run", "sequence": "1", "plan": {}, "meta": {}, "ranks": [], '
                                    b'"run_label": "x"}'])
def test_a_damaged_judged_file_is_refused_naming_it(run_dir, tmp_path, damage):
    judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    path = judge(run_dir, SINGLE, "unshaped/run2", [SINGLE_LOG], 2)["judged"]
    with open(path, "wb") as handle:
        handle.write(damage)
    with pytest.raises(bench_records.RecordsError) as raised:
        bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"), str(tmp_path / "results.jsonl"))
    assert path in str(raised.value)
    assert not os.path.exists(os.path.join(run_dir, "report.md")) and not (tmp_path / "results.jsonl").exists()


def test_an_oversized_record_is_not_read(run_dir, monkeypatch):
    path = judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)["judged"]
    monkeypatch.setattr(bench_records, "MAX_BYTES", os.path.getsize(path) - 1)
    with pytest.raises(bench_records.RecordsError, match="larger than"):
        bench_records.read_run_dir(run_dir)


def test_the_report_made_again_goes_beside_the_first_and_appends_nothing(run_dir, tmp_path):
    for index in range(2):
        judge(run_dir, SINGLE, "unshaped/run%d" % (index + 1), [SINGLE_LOG], index + 1)
    results = tmp_path / "reports" / "results.jsonl"
    first = action("prima.cluster.bench_write_report", {"run_dir": run_dir, "results": str(results)}).run(
        task_vars={})
    assert first["appended"] == 2 and first["report"] == os.path.join(run_dir, "report.md")
    again = action("prima.cluster.bench_write_report", {"reports_dir": str(tmp_path / "reports"), "again": True}).run(
        task_vars={})
    assert os.path.basename(again["report"]).startswith("report-again-") and again["results"] is None
    with open(again["report"]) as made, open(first["report"]) as original:
        assert made.read() == original.read()
    assert len(results.read_text().splitlines()) == 2
    with pytest.raises(AnsibleActionFail, match="No report written: .*report.md exists already"):
        action("prima.cluster.bench_write_report", {"run_dir": run_dir}).run(task_vars={})


def test_the_newest_run_directory_is_the_one_made_last(tmp_path):
    for name, age in (("older", 100), ("newer", 10), ("no-run", 0)):
        (tmp_path / name).mkdir()
        if name != "no-run":
            (tmp_path / name / "raw").mkdir()
        os.utime(tmp_path / name, (1e9 - age, 1e9 - age))
    assert bench_records.newest_run_dir(str(tmp_path)) == str(tmp_path / "newer")
    with pytest.raises(bench_records.RecordsError, match="holds no bench.yml run"):
        bench_records.newest_run_dir(str(tmp_path / "no-run"))
    with pytest.raises(bench_records.RecordsError, match="no reports here"):
        bench_records.newest_run_dir(str(tmp_path / "absent"))


def test_again_name_is_dated():
    moment = datetime.datetime(2026, 12, 4, 13, 5, 9, tzinfo=datetime.timezone.utc)
    assert bench_records.again_name(moment) == "report-again-20261204T130509Z.md"


def test_a_record_is_written_whole_or_not_at_all(tmp_path):
    path = str(tmp_path / "judged.json")
    bench_records.write_json(path, {"a": 1})
    with pytest.raises(ValueError):
        bench_records.write_json(path, {"a": float("nan")})
    assert json.loads((tmp_path / "judged.json").read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["judged.json"]


def test_the_run_record_of_a_judged_entry_is_run_record(run_dir):
    """entry_records is run_record on what the judging read: the same function, no second parser."""
    result = judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    with open(SINGLE_LOG) as handle:
        stderr = handle.read()
    ranks = [{"host": "n0", "rank": 0, "role": "head", "exit": 0, "state": "exited", "left": [], "stderr": stderr}]
    assert result["record"] == run_record(SINGLE, ranks, stderr, meta(run_dir, 1))


def test_the_report_and_results_carry_the_cost_from_the_nodes_price(run_dir, tmp_path):
    # What bench.yml's profile and bench_record's meta carry from a Glows inventory's glows_price_cent.
    profile = [{"rank": 0, "host": "n0", "gpu": "RTX 4090", "vram_gib": 24.0, "ram_gib": 42.0, "disk_read_gbs": 1.5,
                "cpu_cores": 10, "price_cent_per_hour": 65}]
    (tmp_path / "reports" / "r1" / "profile.json").write_text(json.dumps(profile))
    for index in range(2):
        judge(run_dir, SINGLE, "unshaped/%s" % ("warmup0" if index == 0 else "run1"), [SINGLE_LOG], index,
              bench_started="2026-12-02T23:50:00Z", price_cent_per_hour={"n0": 65})
    results = tmp_path / "reports" / "results.jsonl"
    bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"), str(results))
    [line] = [json.loads(text) for text in results.read_text().splitlines()]
    assert line["price_cent_per_hour"] == {"n0": 65} and line["bench_started"] == "2026-12-02T23:50:00Z"
    # $0.65/h / 3600 x (ms per token / 1000) x 1e6
    assert line["usd_per_mtok"] == pytest.approx(0.65 / 3600 * line["ms_per_token"] / 1000 * 1e6)
    report = (tmp_path / "reports" / "r1" / "report.md").read_text()
    # 23:50:00 to 00:00:00 at $0.65/h: $0.11
    assert "Cost of this run: $0.11 (1 node, $0.65/h together, 10 min 0 s of wall time)." in report
    assert "| Price ($/h) | 0.65 |" in report and "| $%.2f |" % line["usd_per_mtok"] in report


def test_without_a_price_the_cost_is_unknown_and_names_the_node(run_dir, tmp_path):
    judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    results = tmp_path / "reports" / "results.jsonl"
    bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"), str(results))
    report = (tmp_path / "reports" / "r1" / "report.md").read_text()
    assert json.loads(results.read_text())["usd_per_mtok"] is None and "| Price ($/h) | unknown |" in report
    assert "Cost of this run: unknown (no price for n0: the inventory gives none;" in report


def test_a_report_made_again_draws_its_plots_apart_from_the_first(run_dir):
    for bits, link in ((10 ** 9, "1gbit"), (10 ** 10, "10gbit")):
        judge(run_dir, PRIMA, "%s/run1" % link, PRIMA_LOGS, 1, link=link, link_bits=bits)
    first = bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"))
    [plot] = [name for name in os.listdir(run_dir) if name.endswith(".png")]
    with open(os.path.join(run_dir, plot), "rb") as handle:
        drawn = handle.read()
    again = bench_records.write_report(run_dir, os.path.join(run_dir, "report-again-x.md"))
    with open(first.report) as handle:
        assert "](%s)" % plot in handle.read()
    with open(again.report) as handle:
        assert "](report-again-x-plots/%s)" % plot in handle.read()
    assert os.path.exists(os.path.join(run_dir, "report-again-x-plots", plot))
    with open(os.path.join(run_dir, plot), "rb") as handle:
        assert handle.read() == drawn


@pytest.mark.parametrize("host", ["..", "../../etc", "", "a/b"])
def test_a_record_pointing_outside_its_run_is_refused(run_dir, host):
    path = judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)["judged"]
    with open(path) as handle:
        entry = json.load(handle)
    entry["ranks"][0]["host"] = host
    bench_records.write_json(path, entry)
    with pytest.raises(bench_records.RecordsError, match="is not a host name this collection writes"):
        bench_records.read_run_dir(run_dir)


def test_a_report_that_cannot_be_written_is_named_and_nothing_is_appended(run_dir, tmp_path):
    judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    results = tmp_path / "reports" / "results.jsonl"
    with pytest.raises(bench_records.RecordsError, match="absent/report.md: cannot be written"):
        bench_records.write_report(run_dir, str(tmp_path / "absent" / "report.md"), str(results))
    assert not results.exists()


def test_results_that_cannot_be_appended_keep_no_report(run_dir, tmp_path):
    judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    report = os.path.join(run_dir, "report.md")
    with pytest.raises(bench_records.RecordsError, match="cannot be appended to .*; the report was not kept either"):
        bench_records.write_report(run_dir, report, str(tmp_path / "absent" / "results.jsonl"))
    assert not os.path.exists(report)


def test_a_results_file_whose_last_line_lost_its_newline_stays_one_object_a_line(run_dir, tmp_path):
    judge(run_dir, SINGLE, "unshaped/run1", [SINGLE_LOG], 1)
    results = tmp_path / "reports" / "results.jsonl"
    results.write_text('{"earlier": 1}')
    bench_records.write_report(run_dir, os.path.join(run_dir, "report.md"), str(results))
    lines = results.read_text().splitlines()
    assert json.loads(lines[0]) == {"earlier": 1} and json.loads(lines[1])["runtime"] == "single"
