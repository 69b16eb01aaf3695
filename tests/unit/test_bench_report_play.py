"""bench.yml's last play writes no report when a node failed or became unreachable alone while the others went
on: its own expression (read from playbooks/bench.yml), run by ansible-playbook on local hosts, one of which
fails mid-play."""

import os
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
REPORT_PLAY = "Write the report and results.jsonl from the run's records"


def not_done_expression():
    with open(os.path.join(REPO, "playbooks", "bench.yml")) as handle:
        plays = yaml.safe_load(handle)
    [play] = [play for play in plays if play.get("name") == REPORT_PLAY]
    return play["vars"]["bench_nodes_not_done"]


@pytest.mark.parametrize("failing, expected", [("none", []), ("b", ["b"])])
def test_a_node_that_did_not_finish_the_benchmark_is_named(tmp_path, failing, expected):
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"cluster": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable} for name in "abc"}}}}}))
    playbook = [
        {"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.set_fact": {"bench_run_id": "r1"}}]},
        {"hosts": "cluster", "gather_facts": False, "vars": {"bench_run_id": "{{ hostvars['localhost'].bench_run_id }}"},
         "pre_tasks": [{"ansible.builtin.set_fact": {"bench_play_hosts": "{{ ansible_play_hosts_all }}"},
                        "delegate_to": "localhost", "delegate_facts": True, "run_once": True}],
         "tasks": [{"ansible.builtin.fail": {"msg": "a node fails alone"}, "when": "inventory_hostname == '%s'" % failing},
                   {"ansible.builtin.set_fact": {"bench_node_done": "{{ bench_run_id }}"}}]},
        {"hosts": "localhost", "gather_facts": False, "vars": {"bench_nodes_not_done": not_done_expression()},
         "tasks": [{"ansible.builtin.copy": {"content": "{{ bench_nodes_not_done | to_json }}",
                                             "dest": str(tmp_path / "not-done.json"), "mode": "0644"}}]}]
    (tmp_path / "playbook.yml").write_text(yaml.safe_dump(playbook))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")  # cwd's, so not the checkout's
    done = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           str(tmp_path / "playbook.yml")], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert (tmp_path / "not-done.json").exists(), done.stdout + done.stderr
    assert yaml.safe_load((tmp_path / "not-done.json").read_text()) == expected
