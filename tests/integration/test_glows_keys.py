"""First contact with a Glows node: root password from the vault, then keys only.

A sandbox node is made to look like a fresh Glows node (root password, password logins
on), the vault is made with ansible-vault, and playbooks/glows-keys.yml installs a new key.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, node, run_playbook

BIN = os.path.dirname(sys.executable)
NODE, ADDRESS, PORT = "n2", "10.77.0.3", 2212  # through the sandbox's access gateway, as on Glows
PASSWORD = "glows-first-contact"


@pytest.fixture
def password_node(site_runs):
    host = node(NODE)
    host.run_expect([0], "echo 'root:%s' | chpasswd" % PASSWORD)
    dropin = "/etc/ssh/sshd_config.d/00-glows-password.conf"
    # As a fresh Glows node lets root in (the sandbox's nodes allow root keys only).
    host.run_expect([0], "printf 'PermitRootLogin yes\\nPasswordAuthentication yes\\n' > %s"
                         " && kill -HUP $(cat /run/sshd.pid)" % dropin)
    yield host
    host.run("rm -f %s && passwd -d root >/dev/null && kill -HUP $(cat /run/sshd.pid)" % dropin)


def ssh_with_key(key, command="true"):
    return subprocess.run(
        ["ssh", "-i", key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-p", str(PORT), "root@" + ADDRESS, command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=30, check=False)


def test_glows_keys_installs_the_key_with_the_vaulted_password(password_node, tmp_path):
    key = str(tmp_path / "id_ed25519")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    assert ssh_with_key(key).returncode != 0, "the new key worked before it was installed"

    vault_password_file = tmp_path / "vault-pass"
    vault_password_file.write_text("test-vault-secret\n")
    vault = tmp_path / "vault.yml"
    vault.write_text("vault_glows_root_password: %s\n" % PASSWORD)
    subprocess.run([os.path.join(BIN, "ansible-vault"), "encrypt", "--vault-password-file",
                    str(vault_password_file), str(vault)], check=True, cwd=REPO)
    assert vault.read_text().startswith("$ANSIBLE_VAULT;")

    inventory = tmp_path / "glows.yml"
    inventory.write_text(
        "all:\n  children:\n    cluster:\n      hosts:\n        glows-test:\n"
        "          ansible_host: %s\n          ansible_port: %d\n          ansible_user: root\n          cluster_ip: %s\n"
        "          ansible_python_interpreter: /usr/bin/python3\n"
        "          ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        " -o PubkeyAuthentication=no\n" % (ADDRESS, PORT, "10.77.0.12"))
    # A control path of its own: ansible.cfg's ControlPersist would otherwise let the run ride on a connection
    # another test's playbook left open to the same address and port, and never log in with the password.
    run = run_playbook("playbooks/glows-keys.yml", inventory=str(inventory),
                       extravars={"glows_vault_file": str(vault), "glows_public_key": key + ".pub"},
                       cmdline="--vault-password-file %s" % vault_password_file, label="glows-keys",
                       envvars={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp-first")})
    assert run.status == "successful", run.describe()
    assert PASSWORD not in run.stdout

    assert ssh_with_key(key).returncode == 0, "the installed key does not log in"
    with open(key + ".pub") as handle:
        public = handle.read().strip()
    authorized = password_node.file("/root/.ssh/authorized_keys").content_string
    assert authorized.count(public) == 1

    again = run_playbook("playbooks/glows-keys.yml", inventory=str(inventory),
                         extravars={"glows_vault_file": str(vault), "glows_public_key": key + ".pub"},
                         cmdline="--vault-password-file %s" % vault_password_file, label="glows-keys-again",
                         envvars={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp-again")})
    assert again.status == "successful" and again.count("changed").get("glows-test", 0) == 0, again.describe()


def test_a_plaintext_vault_file_is_never_printed_at_v(tmp_path):
    """-v prints every task's result, and include_vars' held the root password of a vault file not (yet)
    encrypted. No node is reached: the run stops at the missing public key, after reading the file."""
    vault = tmp_path / "vault.yml"
    vault.write_text("vault_glows_root_password: %s\n" % PASSWORD)
    inventory = tmp_path / "glows.yml"
    inventory.write_text("all:\n  children:\n    cluster:\n      hosts:\n        glows-test:\n"
                         "          ansible_host: 192.0.2.1\n          cluster_ip: 10.77.0.12\n")
    run = run_playbook("playbooks/glows-keys.yml", inventory=str(inventory), cmdline="-v", label="glows-keys-plaintext",
                       extravars={"glows_vault_file": str(vault), "glows_public_key": str(tmp_path / "none.pub")})
    assert run.status == "failed" and "Need vault_glows_root_password" in run.stdout, run.describe()
    assert "TASK [Read the vault file given on the command line]" in run.stdout
    assert PASSWORD not in run.stdout


def test_the_example_inventory_names_the_vault_the_readme_creates():
    with open(os.path.join(REPO, "README.md")) as handle:
        created = re.search(r"ansible-vault create (\S+)", handle.read()).group(1)
    with open(os.path.join(REPO, "inventory", "glows.yml")) as handle:
        comments = "\n".join(line for line in handle.read().splitlines() if line.lstrip().startswith("#"))
    named = re.findall(r"inventory/\S*vault\S*\.yml", comments)
    assert named and set(named) == {created}, (named, created)
    # Ansible loads it with this inventory only from group_vars/<group>/ beside it, for the group `cluster`.
    assert os.path.dirname(created) == "inventory/group_vars/cluster", created
