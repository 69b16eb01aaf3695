"""The readiness suite's variables come from Ansible's own variable manager: role defaults, then the inventory's
group and host variables, then --readiness-var as -e, and a vault in the inventory opens as for ansible-playbook.
Each case runs in a process of its own, as the suite does: Ansible reads its configuration (the vault password
file among it) once per process."""

import json
import os
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESOLVE = r"""
import importlib.util, json, os, sys, types
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([os.path.join(sys.argv[1], ".collections")])
spec = importlib.util.spec_from_file_location("readiness_conftest",
                                              os.path.join(sys.argv[1], "tests", "readiness", "conftest.py"))
readiness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readiness)
inventory, overrides, names = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4].split(",")
found = {}
for host in ("h1", "h2"):
    try:
        node = readiness.Node(types.SimpleNamespace(backend=types.SimpleNamespace(host=host)), inventory, overrides)
    except ValueError as error:
        print(json.dumps({"error": str(error)}))
        sys.exit(0)
    found[host] = {name: node.var(name) for name in names}
print(json.dumps(found))
"""


def resolve(inventory, names, overrides=None, vault_password_file=None):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    if vault_password_file:
        env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(vault_password_file)
    done = subprocess.run([sys.executable, "-c", RESOLVE, REPO, str(inventory), json.dumps(overrides or {}),
                           ",".join(names)], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def role_default(role, name):
    with open(os.path.join(REPO, "roles", role, "defaults", "main.yml")) as handle:
        return yaml.safe_load(handle)[name]


def write_inventory(root, **host_vars):
    (root / "group_vars" / "all").mkdir(parents=True)
    (root / "group_vars" / "all" / "main.yml").write_text("llama_cpp_root: /srv/from-group\n")
    hosts = {name: dict({"ansible_host": "127.0.0.1"}, **host_vars.get(name, {})) for name in ("h1", "h2")}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return root / "hosts.yml"


def test_role_defaults_then_group_then_host_then_the_command_line(tmp_path):
    inventory = write_inventory(tmp_path, h1={"llama_cpp_root": "/srv/from-host"})
    names = ["zeromq_min_version", "llama_cpp_root"]
    assert resolve(inventory, names) == {
        "h1": {"zeromq_min_version": role_default("zeromq", "zeromq_min_version"), "llama_cpp_root": "/srv/from-host"},
        "h2": {"zeromq_min_version": role_default("zeromq", "zeromq_min_version"), "llama_cpp_root": "/srv/from-group"}}
    overridden = resolve(inventory, names, {"llama_cpp_root": "/srv/from-e", "zeromq_min_version": "9.9"})
    assert overridden["h1"] == overridden["h2"] == {"zeromq_min_version": "9.9", "llama_cpp_root": "/srv/from-e"}


def test_a_vaulted_inventory_opens_with_the_password_file_and_says_so_without_it(tmp_path):
    inventory = write_inventory(tmp_path)
    password = tmp_path / "vault-password"
    password.write_text("not-a-real-password\n")
    vault = tmp_path / "group_vars" / "all" / "vault.yml"
    vault.write_text('vault_serve_api_key: "0123456789abcdef; x"\n')
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-vault"), "encrypt", "--vault-password-file",
                    str(password), str(vault)], check=True, capture_output=True)
    assert resolve(inventory, ["vault_serve_api_key"], vault_password_file=password)["h1"] == {
        "vault_serve_api_key": "0123456789abcdef; x"}
    refused = resolve(inventory, ["vault_serve_api_key"])
    assert refused["error"].startswith("h1: the inventory's variables cannot be read: "), refused
    assert "ANSIBLE_VAULT_PASSWORD_FILE=FILE" in refused["error"], refused
