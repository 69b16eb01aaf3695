"""tools/sandbox_scale.py (N copies of a provisioned node) and benchmarks/scale.py's arithmetic."""

import os
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import sandbox_scale  # noqa: E402  # pylint: disable=wrong-import-position
import scale  # noqa: E402  # pylint: disable=wrong-import-position


def hosts_of(inventory):
    return inventory["all"]["children"]["sandbox"]["children"]["cluster"]["hosts"]


def test_the_copies_are_mapped_like_glows_beside_clusters_a_and_b_without_sharing_an_address_or_port():
    scaled = hosts_of(sandbox_scale.scaled_inventory(sandbox_scale.MAX_NODES, "n0"))
    assert list(scaled)[:3] == ["s0", "s1", "s2"]
    taken = {}
    for name in ("sandbox-mapped.yml", "sandbox-mapped-b.yml"):
        with open(os.path.join(REPO, "inventory", name)) as handle:
            for host, values in hosts_of(yaml.safe_load(handle)).items():
                taken[values["cluster_ip"]] = taken[values["ansible_port"]] = host
    addresses = [values["cluster_ip"] for values in scaled.values()]
    ports = [values["ansible_port"] for values in scaled.values()]
    assert len(set(addresses)) == len(set(ports)) == sandbox_scale.MAX_NODES
    assert not set(addresses + ports) & set(taken)
    assert all(address.startswith("10.77.0.") and int(address.rsplit(".", 1)[1]) < 255 for address in addresses)
    assert {values["ansible_host"] for values in scaled.values()} == {"10.77.0.3"}
    assert {values["sandbox_copy_of"] for values in scaled.values()} == {"n0"}


@pytest.mark.parametrize("nodes", [1, 0, -3, sandbox_scale.MAX_NODES + 1])
def test_a_size_outside_the_address_plan_is_refused_naming_the_option(nodes):
    with pytest.raises(ValueError, match=r"--nodes %d: a scaled cluster has 2 to 16 nodes" % nodes):
        sandbox_scale.node_names(nodes)


def test_the_written_inventory_reads_the_sandbox_settings_through_its_group_vars(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_scale, "SCALED_DIR", str(tmp_path / "scaled"))
    path = sandbox_scale.write_inventory(3, "n0")
    assert path == str(tmp_path / "scaled" / "sandbox-scaled-3.yml")
    assert not os.path.exists(path + ".partial")
    listed = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", path,
                             "--host", "s2"], capture_output=True, text=True, check=True, cwd=str(tmp_path))
    host = yaml.safe_load(listed.stdout)
    assert host["cluster_ip"] == "10.77.0.22" and host["ansible_port"] == 2222
    # From inventory/group_vars/sandbox.yml: the hub, the catalog.
    assert host["models_hub_endpoint"] == "http://10.77.0.2:8088"
    assert "tiny" in host["models_extra_catalog"]
    # Written again (another N): the link stays, the file is replaced whole.
    assert sandbox_scale.write_inventory(2, "n1").endswith("sandbox-scaled-2.yml")
    with open(str(tmp_path / "scaled" / "sandbox-scaled-2.yml")) as handle:
        assert list(hosts_of(yaml.safe_load(handle))) == ["s0", "s1"]


RECAP = """PLAY RECAP *********************************************************************
localhost                  : ok=4    changed=0    unreachable=0    failed=0    skipped=4    rescued=0    ignored=0
s0                         : ok=133  changed=2    unreachable=0    failed=0    skipped=31   rescued=0    ignored=0
s1                         : ok=116  changed=0    unreachable=0    failed=0    skipped=24   rescued=0    ignored=0
"""


def test_the_changed_count_is_read_per_host_from_the_recap():
    assert scale.recap_changed("TASK [x] ***\nok: [s0]\n" + RECAP) == {"localhost": 0, "s0": 2, "s1": 0}
    assert scale.recap_changed("no recap at all") == {}


def test_the_marginal_cost_is_the_slope_between_the_smallest_and_largest_cluster():
    by_nodes = {6: {"site_second_s": 107.5, "weights_s": 30.0}, 3: {"site_second_s": 68.0, "weights_s": 21.0},
                4: {"site_second_s": 1000.0}}
    assert scale.marginal(by_nodes, ["site_second_s", "weights_s"]) == {"site_second_s": 13.17, "weights_s": 3.0}
    assert scale.growth(by_nodes, ["site_second_s", "weights_s"]) == {"site_second_s": 1.58, "weights_s": 1.43}
    assert scale.marginal({3: {"site_second_s": 1.0}}, ["site_second_s"]) == {}


def test_the_markdown_has_a_row_per_figure_and_a_column_per_size():
    figures = {"site_second_s": 60.0, "bench_run_overhead_s": 5.0, "bench_server_overhead_s": 4.0, "weights_s": 20.0,
               "site_second_changed": 0, "hub_bytes_per_model": 1.0}
    bigger = dict(figures, site_second_s=90.0, weights_s=26.0)
    by_nodes = {3: figures, 6: bigger}
    keys = [figure[0] for figure in scale.FIGURES]
    result = {"command": "python3 benchmarks/scale.py", "by_nodes": {"3": figures, "6": bigger},
              "marginal": scale.marginal(by_nodes, keys), "growth": scale.growth(by_nodes, keys), "model": "tiny",
              "runtime": "llama_rpc", "runs": 3, "clients": "1", "model_bytes": 55102112, "hub_rate": "200mbit"}
    text = scale.markdown(result)
    assert "| Figure | N = 3 | N = 6 | N = 6 / N = 3 | Per node added |" in text
    assert "| site.yml, second run (changed=0 expected) | 60.00 s | 90.00 s | 1.5 | 10.0 s |" in text
    assert "changed 0 at N = 3, 0 at N = 6" in text


def test_only_a_plain_provisioned_node_is_copied(tmp_path):
    node_root = str(tmp_path / "nodes" / "%s" / "root")
    assert "not a sandbox node name" in sandbox_scale.source_problem("../n0", node_root)
    assert "not a sandbox node name" in sandbox_scale.source_problem("n0;rm", node_root)
    assert "not a sandbox node name" in sandbox_scale.source_problem("n0\n", node_root)
    assert "no such sandbox node" in sandbox_scale.source_problem("n0", node_root)
    (tmp_path / "nodes" / "n0" / "root" / "etc").mkdir(parents=True)
    assert "make site-sandbox first" in sandbox_scale.source_problem("n0", node_root)
    mark = tmp_path / "nodes" / "n0" / "root" / sandbox_scale.PROVISIONED_MARK
    mark.parent.mkdir(parents=True)
    mark.write_text("{}")
    assert sandbox_scale.source_problem("n0", node_root) == ""
