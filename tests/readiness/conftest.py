"""Is every node ready for a benchmark? testinfra against any inventory:

    pytest tests/readiness --hosts='ansible://all' --ansible-inventory=inventory/glows.yml

Each node's expected state comes from the variables the playbooks use, resolved by Ansible itself as a play of
the collection's roles sees them: role defaults, the inventory's group and host variables, --readiness-var
NAME=VALUE as -e.
"""

import functools
import json
import os
import sys
from typing import Any, Dict, List, Tuple

import pytest
import testinfra
import yaml

from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.readiness import first_line, glance

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

RESULTS = {}  # type: Dict[Any, Any]


def pytest_addoption(parser):
    parser.addoption("--readiness-var", action="append", default=[], metavar="NAME=VALUE",
                     help="override a variable for every node, like ansible-playbook -e (VALUE is read as YAML)")


@functools.lru_cache(maxsize=None)
def ansible_variables(inventory: str, overrides_json: str) -> Tuple[Any, Any, Any, Any]:
    """Ansible's own variable manager for the inventory, with the overrides as -e and a play holding every role
    of the collection: each node's variables come out with Ansible's precedence, not an imitation of it."""
    from ansible import constants, context
    from ansible.cli import CLI
    from ansible.inventory.manager import InventoryManager
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.play import Play
    from ansible.vars.manager import VariableManager

    context.CLIARGS = ImmutableDict(extra_vars=(overrides_json,))
    loader = DataLoader()
    # A vault in the inventory (the serve key, the hub token) opens as for ansible-playbook: the vault identities
    # and password file of the configuration or the environment (ANSIBLE_VAULT_PASSWORD_FILE), no prompt.
    loader.set_vault_secrets(CLI.setup_vault_secrets(loader, vault_ids=list(constants.DEFAULT_VAULT_IDENTITY_LIST),
                                                     auto_prompt=False))
    hosts = InventoryManager(loader=loader, sources=[inventory] if inventory else constants.DEFAULT_HOST_LIST)
    manager = VariableManager(loader=loader, inventory=hosts)
    roles = os.path.join(REPO, "roles")
    play = Play.load({"name": "readiness", "hosts": "all", "gather_facts": False,
                      "roles": ["prima.cluster." + role for role in sorted(os.listdir(roles))
                                if os.path.exists(os.path.join(roles, role, "defaults", "main.yml"))]},
                     variable_manager=manager, loader=loader)
    return loader, hosts, manager, play


class Node:
    """One node: its variables as a play of the collection's roles sees them, and the local facts site.yml left
    on it."""

    def __init__(self, host, inventory: str, overrides: Dict[str, Any]):
        from ansible.errors import AnsibleError
        from ansible.template import Templar

        self.host = host
        self.name = host.backend.host
        loader, hosts, manager, play = ansible_variables(inventory, json.dumps(overrides, sort_keys=True, default=str))
        known = hosts.get_host(self.name)
        if known is None:
            raise ValueError("%s is not in the inventory %s" % (self.name, inventory or "of ansible.cfg"))
        try:
            self._raw = manager.get_vars(play=play, host=known)
        except AnsibleError as error:
            message = str(error).splitlines()[0]
            hint = ("; give the vault's password as for ansible-playbook: ANSIBLE_VAULT_PASSWORD_FILE=FILE"
                    if "vault" in message.lower() else "")
            raise ValueError("%s: the inventory's variables cannot be read: %s%s" % (self.name, message, hint))
        self._templar = Templar(loader=loader, variables=self._raw)

    def var(self, name: str, default: Any = None) -> Any:
        if name not in self._raw:
            return default
        try:
            return self._templar.template(self._raw[name])
        except Exception:  # a default that needs facts gathered on the node: not known here
            return default

    @functools.cached_property
    def facts(self) -> Dict[str, Any]:
        found = {}
        listing = self.host.run("ls /etc/ansible/facts.d 2>/dev/null")
        for name in listing.stdout.split():
            if name.endswith(".fact"):
                found[name[:-5]] = json.loads(self.host.file("/etc/ansible/facts.d/" + name).content_string)
        return found

    @functools.cached_property
    def hardware(self) -> Dict[str, Any]:
        """What the launch role plans with, read as Ansible and the cuda role read it: memory, cores, GPUs."""
        from ansible_collections.prima.cluster.plugins.filter.cuda import cuda_parse_gpus

        memory = self.host.run("awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo")
        cores = self.host.run("nproc")
        smi = self.host.run("nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version "
                            "--format=csv,noheader,nounits")
        return {"ansible_facts": {"memtotal_mb": int(memory.stdout.strip() or 0),
                                  "processor_nproc": int(cores.stdout.strip() or 1)},
                "cuda_gpus": cuda_parse_gpus(smi.stdout) if smi.rc == 0 else []}


def _overrides(config) -> Dict[str, Any]:
    values = {}
    for item in config.getoption("readiness_var"):
        name, dummy, value = item.partition("=")
        values[name] = yaml.safe_load(value)
    return values


@pytest.fixture(scope="module")
def node(host, request) -> Node:
    return Node(host, request.config.getoption("ansible_inventory") or "", _overrides(request.config))


@pytest.fixture(scope="session")
def cluster(request) -> List[Node]:
    """Every node of the run, in rank order."""
    from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import cluster_ranks

    inventory = request.config.getoption("ansible_inventory") or ""
    specs = [spec for spec in (request.config.getoption("hosts") or "").split(",") if spec]
    hosts = testinfra.get_hosts(specs, ansible_inventory=inventory)
    nodes = [Node(host, inventory, _overrides(request.config)) for host in hosts]
    ranks = cluster_ranks([item.name for item in nodes], {item.name: {"rank": item.var("rank")} for item in nodes})
    return sorted(nodes, key=lambda item: ranks[item.name])


def cluster_transport(cluster: List[Node]) -> Dict[str, Any]:
    """The transport the last site.yml or bench.yml picked (the transport role's local fact on every node)."""
    found = [item.facts.get("transport") or {} for item in cluster]
    modes = {fact.get("mode") for fact in found}
    if len(modes) == 1 and None not in modes:
        return found[0]
    return {"mode": "direct", "reason": "no transport recorded on every node (site.yml predates it)"}


@pytest.fixture(scope="session")
def transport(cluster) -> Dict[str, Any]:
    return cluster_transport(cluster)


@pytest.fixture(scope="session")
def cluster_plans(cluster):
    """The units bench.yml would run on these nodes, for the first selected model, and the catalog: the
    launch role's own planner, with its options from the same variables."""
    from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import (
        LaunchOptions, cluster_nodes, launch_plans)
    from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import merged_catalog, models_selection
    from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import runtimes_selection

    first = cluster[0]
    catalog = merged_catalog(first.var("models_catalog", {}), first.var("models_extra_catalog", {}))
    models = models_selection(first.var("model"), first.var("models_enabled", []), catalog)[:1]
    runtimes = runtimes_selection("all", bool(first.var("prima_enabled", True)))
    hostvars = {item.name: dict(item.hardware, cluster_ip=item.var("cluster_ip"), gpu_mem=item.var("gpu_mem"))
                for item in cluster}
    nodes = cluster_nodes([item.name for item in cluster], hostvars, int(first.var("launch_mem_reserve_mib")))
    options = LaunchOptions.from_mapping({
        "models_dir": first.var("cluster_models_dir"), "state_dir": first.var("cluster_state_dir"),
        "prima_cli": "llama-cli", "llama_cpp_bin": "", "data_port_base": first.var("cluster_data_port_base"),
        "signal_port_base": first.var("cluster_signal_port_base"), "rpc_port": first.var("cluster_rpc_port"),
        "layer_window": "auto", "prefetch": False, "threads": 1, "prompt": "", "n_predict": 1, "ctx_size": 1,
        "seed": 0, "transport": cluster_transport(cluster)["mode"]})
    return list(launch_plans(nodes, runtimes, models, catalog, options).values()), catalog


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not item.config.getoption("hosts"):
        return
    if report.when == "call" or report.outcome != "passed":
        host = item.funcargs.get("host") if hasattr(item, "funcargs") else None
        where = host.backend.host if host is not None else "cluster"
        check = item.originalname.replace("test_", "", 1)
        state = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[report.outcome]
        reason = ""
        if report.outcome == "failed":
            reason = first_line(str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message))
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        if (check, where) not in RESULTS or state == "FAIL":
            RESULTS[(check, where)] = (state, reason)


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    nodes = []  # type: List[str]
    for _check, where in RESULTS:
        if where not in nodes and where != "cluster":
            nodes.append(where)
    nodes.append("cluster")
    terminalreporter.section("readiness at a glance")
    terminalreporter.write_line(glance(RESULTS, nodes))


def pytest_collection_modifyitems(config, items):
    """Without --hosts testinfra would check the machine pytest runs on: skip instead, saying how to run."""
    if config.getoption("hosts"):
        return
    skip = pytest.mark.skip(reason="the readiness suite checks an inventory's nodes: make ready INVENTORY=..., or "
                                   "pytest tests/readiness --hosts='ansible://all' --ansible-inventory=FILE")
    for item in items:
        if "tests/readiness" in str(item.fspath):
            item.add_marker(skip)
