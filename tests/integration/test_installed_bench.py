"""bench.yml as an installed collection runs it: the tarball built from this checkout, installed into an empty
collections path, run by its full name from a directory without this repository's ansible.cfg (so without the
bench_report callback) on the provisioned sandbox. It writes report.md and results.jsonl as the in-repo run does,
and prima.cluster.report makes the same report again from the run's raw logs."""

import json
import os
import re
import subprocess
import sys

from conftest import ARTIFACTS, REPO, SANDBOX_INVENTORY

BIN = os.path.dirname(sys.executable)


def run(argv, cwd, env, label, timeout=1800):
    done = subprocess.run(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout, check=False)
    os.makedirs(ARTIFACTS, exist_ok=True)
    with open(os.path.join(ARTIFACTS, "%s.log" % label), "w") as handle:
        handle.write("$ %s\n%s" % (" ".join(argv), done.stdout))
    return done


def headings(text):
    """The report's sections, without its title (the run id) and prima.cpp's own (the in-repo run may have it)."""
    return [line for line in text.splitlines()[1:] if line.startswith("#") and "prima.cpp's device profile" not in line]


def test_the_installed_collection_writes_the_report_and_results(provisioned, both_modes_bench, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANSIBLE_", "PRIMA_BENCH_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"), ANSIBLE_NOCOLOR="1",
               PATH=BIN + os.pathsep + env.get("PATH", ""), PRIMA_BENCH_RUN_ID="installed-1")
    built = run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", REPO, "--output-path", str(tmp_path)],
                work, env, "installed-build")
    assert built.returncode == 0, built.stdout
    tarball = re.search(r"Created collection for prima\.cluster at (\S+)", built.stdout).group(1)
    installed = run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", tarball], work, env,
                    "installed-install")
    assert installed.returncode == 0 and "was installed successfully" in installed.stdout, installed.stdout
    assert not (work / "ansible.cfg").exists() and not os.path.exists(os.path.join(str(work), "..", "ansible.cfg"))

    bench = run([os.path.join(BIN, "ansible-playbook"), "-i", SANDBOX_INVENTORY,
                 "prima.cluster.bench", "-e", "model=tiny", "-e", "runtime=llama_rpc,single", "-e", "runs=1"],
                work, env, "installed-bench")
    assert bench.returncode == 0, bench.stdout[-6000:]
    reports = work / "reports"
    report, results = reports / "installed-1" / "report.md", reports / "results.jsonl"
    assert "bench report: %s (2 measured runs appended to %s)" % (report, results) in bench.stdout, bench.stdout[-3000:]

    # The same shape as the in-repo run (ansible.cfg, its callback): the report's sections, each line's keys.
    in_repo = both_modes_bench["reports"]
    repo_report = (in_repo / both_modes_bench["run_ids"]["run"] / "report.md").read_text()
    assert headings(report.read_text()) == headings(repo_report)
    lines = [json.loads(text) for text in results.read_text().splitlines()]
    repo_lines = [line for line in map(json.loads, (in_repo / "results.jsonl").read_text().splitlines()[1:])
                  if line.get("mode") == "run" and line["runtime"] != "prima"]
    assert sorted(line["runtime"] for line in lines) == ["llama_rpc", "single"]
    assert {tuple(sorted(line)) for line in lines} == {tuple(sorted(line)) for line in repo_lines}

    # The report made again from the run's raw logs, by the installed playbook, from the same directory.
    again = run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "prima.cluster.report"], work, env,
                "installed-report-again")
    assert again.returncode == 0, again.stdout[-4000:]
    [made] = [name for name in os.listdir(str(reports / "installed-1")) if name.startswith("report-again-")]
    assert (reports / "installed-1" / made).read_text() == report.read_text()
    assert len(results.read_text().splitlines()) == 2, "the report made again appended to results.jsonl"
