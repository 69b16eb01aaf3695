"""The inventory plugin prima.cluster.glows, run as the user runs it (ansible-inventory, GLOWS_* in the environment)
against the fake Glows API: hosts of group cluster in rank order with their variables, the root password nowhere
(output at -vvv, cache), a fresh cache makes no API call, and a failure is one line naming what to fix. No node is
reached: glows-keys.yml is run only as far as its first connection."""

import glob
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.glows import inventory as glows_inventory
from ansible_collections.prima.cluster.plugins.plugin_utils.glows.api import GlowsClient
from ansible_collections.prima.cluster.tests.fakes.glows_api import plain, post_faults, serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
TOKEN = "glows-inventory-test-token-42"


@pytest.fixture
def fake(tmp_path):
    with serving(token=TOKEN, state_file=str(tmp_path / "glows.json")) as server:
        yield server


def rent(fake, *keys, **extra):
    client = GlowsClient(fake.url, TOKEN)
    made = []
    for key in keys:
        body = {"from_image_id": "img-87p9kq26", "gpu_name": "NVIDIA GeForce RTX 4090", "custom_meta_key": key,
                "instance_category": "container", "region_name": "TW-03"}
        body.update(extra)
        made.append(client.create(body))
    return made


def passwords(fake):
    with urllib.request.urlopen(fake.root + "/_fake/state", timeout=10) as response:
        state = json.loads(response.read())
    found = [item["sshCred"]["password"] for item in state["instances"]]
    assert found and all(found)
    return found


def inventory(tmp_path, fake, config="", *args, env=None, name="x.glows.yml"):
    path = tmp_path / name
    path.write_text("plugin: prima.cluster.glows\n" + config)
    environment = dict(os.environ, GLOWS_API_URL=fake.url, GLOWS_SDK_TOKEN=TOKEN,
                       GLOWS_RENTAL_FILE=str(tmp_path / "no-rental.json"), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    environment.pop("GLOWS_META_KEY_PREFIX", None)
    environment.update(env or {})
    return subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(path), "--list"] + list(args),
                          cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120, check=False)


def listing(run):
    assert run.returncode == 0, run.stderr
    return plain(json.loads(run.stdout))


def test_hosts_in_rank_order_with_their_variables(tmp_path, fake):
    made = {item["metaKey"]: item for item in rent(fake, "bench-x-10", "bench-x-2", "bench-x-0", "other-0")}
    data = listing(inventory(tmp_path, fake, "meta_key_prefix: bench-x-\ngroups:\n  sandbox: true\n"))
    assert data["cluster"]["hosts"] == ["bench-x-0", "bench-x-2", "bench-x-10"]
    assert data["sandbox"]["hosts"] == ["bench-x-0", "bench-x-2", "bench-x-10"]
    variables = data["_meta"]["hostvars"]["bench-x-2"]
    now = GlowsClient(fake.url, TOKEN).query(meta_key="bench-x-2")
    assert (variables["ansible_host"], variables["ansible_port"]) == glows_inventory.ssh_access(now)
    assert variables["ansible_user"] == "root"
    assert variables["glows_instance_id"] == made["bench-x-2"]["instanceID"]
    assert variables["glows_meta_key"] == "bench-x-2" and variables["glows_status"] == "Running"
    assert variables["gpu_name"] == "NVIDIA GeForce RTX 4090" and variables["gpu_mem"] == 23.98
    assert variables["glows_price_cent"] == 65 and variables["glows_region"] == "TW-03"
    assert variables["glows_api_url"] == fake.url
    assert variables["glows_created"] == made["bench-x-2"]["createTime"]["seconds"]
    for key in ("glows_gpu_count", "glows_cpu_cores", "glows_ram_gib", "glows_disk_gib", "glows_image", "glows_remark"):
        assert key in variables
    assert "ansible_password" not in json.dumps(data) and "sshCred" not in json.dumps(data)


def test_the_rental_file_gives_the_prefix(tmp_path, fake):
    rent(fake, "rent-a-0", "rent-a-1", "rent-ab-0")
    rental = tmp_path / "rental.json"
    rental.write_text(json.dumps({"prefix": "rent-a", "api_url": fake.url}))
    data = listing(inventory(tmp_path, fake, env={"GLOWS_RENTAL_FILE": str(rental)}))
    assert data["cluster"]["hosts"] == ["rent-a-0", "rent-a-1"]
    data = listing(inventory(tmp_path, fake, env={"GLOWS_RENTAL_FILE": str(rental), "GLOWS_META_KEY_PREFIX": "rent-"}))
    assert data["cluster"]["hosts"] == ["rent-a-0", "rent-a-1", "rent-ab-0"]
    rental.write_text("{}")
    run = inventory(tmp_path, fake, env={"GLOWS_RENTAL_FILE": str(rental)})
    assert run.returncode != 0 and "the Glows rental file %s has no \"prefix\"" % rental in run.stderr


def test_filters_and_constructed_options(tmp_path, fake):
    rent(fake, "f-0", remark="keep")
    rent(fake, "f-1", remark="other")
    data = listing(inventory(tmp_path, fake, "remark: keep\ncompose:\n  gpu_mem: gpu_mem - 2\n"
                                             "keyed_groups:\n  - key: glows_region\n    prefix: region\n"))
    assert data["cluster"]["hosts"] == ["f-0"] and data["region_TW_03"]["hosts"] == ["f-0"]
    assert data["_meta"]["hostvars"]["f-0"]["gpu_mem"] == pytest.approx(21.98)
    assert not listing(inventory(tmp_path, fake, "regions: [TW-04]\n")).get("cluster", {}).get("hosts")


def test_no_password_or_token_in_any_output_at_vvv(tmp_path, fake):
    rent(fake, "p-0", "p-1")
    run = inventory(tmp_path, fake, "", "-vvv")
    assert run.returncode == 0, run.stderr
    for secret in passwords(fake) + [TOKEN]:
        assert secret not in run.stdout and secret not in run.stderr


def test_the_cache_holds_no_password_and_a_fresh_one_makes_no_call(tmp_path, fake):
    rent(fake, "c-0", "c-1")
    cache = tmp_path / "cache"
    config = ("cache: true\ncache_plugin: ansible.builtin.jsonfile\ncache_connection: %s\ncache_timeout: 600\n"
              % cache)
    first = listing(inventory(tmp_path, fake, config))
    files = glob.glob(str(cache / "*"))
    assert files, "nothing was cached"
    stored = "".join(open(path).read() for path in files)
    assert "c-0" in stored
    for secret in passwords(fake) + [TOKEN]:
        assert secret not in stored
    # Every API call now fails: only a cache hit can list the hosts.
    post_faults(fake, error_next={"code": 1, "msg": "internal error", "count": 1000})
    assert listing(inventory(tmp_path, fake, config)) == first
    refreshed = inventory(tmp_path, fake, config, "--flush-cache")
    assert refreshed.returncode != 0 and "answered code 1 (internal error)" in refreshed.stderr


def test_a_node_without_ssh_access_fails_the_whole_inventory_naming_it(tmp_path, fake):
    rent(fake, "s-0")
    post_faults(fake, no_ssh_access=True)
    late = rent(fake, "s-1")[0]
    run = inventory(tmp_path, fake)
    assert run.returncode != 0 and run.stdout.strip() == ""
    line = ("instance %s (metaKey s-1) has no SSH access yet (accesses has no ssh url): wait until it is Running, or "
            "create it with port 22 exported" % late["instanceID"])
    assert line in run.stderr
    assert [text for text in run.stderr.splitlines() if line in text], run.stderr


def test_a_bad_or_missing_token_is_one_line_with_the_fix(tmp_path, fake):
    run = inventory(tmp_path, fake, env={"GLOWS_SDK_TOKEN": "wrong-" + TOKEN})
    assert run.returncode != 0
    assert "the Glows API refused the token (code 176" in run.stderr and "set GLOWS_SDK_TOKEN" in run.stderr
    assert TOKEN not in run.stderr
    run = inventory(tmp_path, fake, env={"GLOWS_SDK_TOKEN": ""})
    assert run.returncode != 0 and "has no token: set GLOWS_SDK_TOKEN" in run.stderr


def test_the_token_may_be_a_vault_string(tmp_path, fake):
    rent(fake, "v-0")
    secret = tmp_path / "vault-pass"
    secret.write_text("inventory-vault-secret\n")
    encrypted = subprocess.run([os.path.join(BIN, "ansible-vault"), "encrypt_string", "--vault-password-file",
                                str(secret), TOKEN, "--name", "token"], cwd=REPO, stdout=subprocess.PIPE,
                               universal_newlines=True, check=True).stdout
    run = inventory(tmp_path, fake, encrypted, "--vault-password-file", str(secret), env={"GLOWS_SDK_TOKEN": ""})
    assert listing(run)["cluster"]["hosts"] == ["v-0"]


def test_glows_keys_takes_the_password_from_the_api_and_never_prints_it(tmp_path, fake):
    """Up to the first connection: the fake's access ports lead nowhere, so the run stops unreachable, after the
    password went into ansible_password. At -vvv nothing of it may show."""
    rent(fake, "k-0")
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGlvd3MtdGVzdC1rZXktbm90LXJlYWwtYXQtYWxsLQ test\n")
    config = tmp_path / "x.glows.yml"
    config.write_text("plugin: prima.cluster.glows\n")
    environment = dict(os.environ, GLOWS_API_URL=fake.url, GLOWS_SDK_TOKEN=TOKEN,
                       GLOWS_RENTAL_FILE=str(tmp_path / "none.json"), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                       ANSIBLE_SSH_ARGS="-o ConnectTimeout=5", ANSIBLE_TIMEOUT="5")
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-vvv", "-i", str(config), "playbooks/glows-keys.yml",
                          "-e", "glows_public_key=%s" % key, "-e", "ansible_ssh_common_args='-o StrictHostKeyChecking=no'"],
                         cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=300, check=False)
    assert "Take the root password from the Glows API" in run.stdout, run.stdout
    assert "UNREACHABLE" in run.stdout or "unreachable=1" in run.stdout, run.stdout
    assert "Need vault_glows_root_password" not in run.stdout
    for secret in passwords(fake) + [TOKEN]:
        assert secret not in run.stdout


def test_a_rental_takes_only_its_own_keys_not_those_of_a_longer_prefix(tmp_path, fake):
    # Rental "rent-a" owns rent-a-<digits>; "rent-a-1" is another rental (a valid prefix) that release of rent-a
    # never cancels, so the inventory of rent-a must not run the cluster on it either.
    rent(fake, "rent-a-0", "rent-a-1", "rent-a-1-0", "rent-a-x")
    rental = tmp_path / "rental.json"
    rental.write_text(json.dumps({"prefix": "rent-a"}))
    data = listing(inventory(tmp_path, fake, env={"GLOWS_RENTAL_FILE": str(rental)}))
    assert data["cluster"]["hosts"] == ["rent-a-0", "rent-a-1"]
    # meta_key_prefix stays a plain "starts with" filter, as documented.
    data = listing(inventory(tmp_path, fake, env={"GLOWS_RENTAL_FILE": str(rental), "GLOWS_META_KEY_PREFIX": "rent-a-"}))
    assert data["cluster"]["hosts"] == ["rent-a-0", "rent-a-1", "rent-a-1-0", "rent-a-x"]


def adhoc(tmp_path, fake, *args, config="", env=None):
    """An ad-hoc ansible run of the inventory; debug runs on the controller, so no node is reached."""
    path = tmp_path / "x.glows.yml"
    path.write_text("plugin: prima.cluster.glows\n" + config)
    environment = dict(os.environ, GLOWS_API_URL=fake.url, GLOWS_SDK_TOKEN=TOKEN, ANSIBLE_NOCOLOR="1",
                       GLOWS_RENTAL_FILE=str(tmp_path / "no-rental.json"),
                       ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    environment.pop("GLOWS_META_KEY_PREFIX", None)
    environment.update(env or {})
    return subprocess.run([os.path.join(BIN, "ansible"), "-i", str(path), "cluster"] + list(args), cwd=REPO,
                          env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=120, check=False)


def test_api_strings_in_host_variables_are_never_templated(tmp_path, fake):
    """A remark (any API string) holding a template is data: using the variable gives the text, not its result.
    ansible-core 2.19 leaves a plugin's strings untrusted by itself; on 2.18 (still supported) this failed before
    the plugin wrapped them (msg '1337')."""
    marker = tmp_path / "templated"
    remark = "{{ 7 * 191 }}{{ lookup('ansible.builtin.pipe', 'touch %s') }}" % marker
    rent(fake, "u-0", remark=remark)
    run = adhoc(tmp_path, fake, "-m", "ansible.builtin.debug", "-a", "msg={{ glows_remark }}")
    assert run.returncode == 0, run.stdout
    assert "1337" not in run.stdout and not marker.exists(), run.stdout
    assert "{{ 7 * 191 }}" in run.stdout, run.stdout


def with_ssh_url(url, **extra):
    value = {"instanceID": "ins-evil", "metaKey": "evil-0", "status": "Running",
             "accesses": [{"protocol": "ssh", "listenPort": 22, "url": url}]}
    value.update(extra)
    return value


@pytest.mark.parametrize("url", ["ssh://-oproxycommand=touch${IFS}x:22", "ssh://-oProxyCommand=x", "ssh://a b:22",
                                 "ssh://a%20b:22", "ssh://a;b:22", "ssh://a_b.example:22", "ssh://-a.example:22",
                                 "ssh://a..b:22", "ssh://user@a.example:22", "ssh://a.example:22/x",
                                 "ssh://a.example:22?x=1", "ssh://a.example:0", "ssh://a.example:65536",
                                 "ssh://" + "a" * 64 + ".example:22"])
def test_an_ssh_access_host_that_is_no_host_name_or_address_is_refused(url):
    with pytest.raises(glows_inventory.GlowsError, match="ins-evil .*not ssh://host:port with a host name or IP"):
        glows_inventory.ssh_access(with_ssh_url(url))


@pytest.mark.parametrize("url, access", [("ssh://tw-03.access.glows.ai:23001", ("tw-03.access.glows.ai", 23001)),
                                         ("ssh://10.77.0.3:23000", ("10.77.0.3", 23000)),
                                         ("ssh://[2001:db8::1]:2222", ("2001:db8::1", 2222)),
                                         ("ssh://a.example/", ("a.example", 22))])
def test_an_ssh_access_host_name_or_address_is_taken(url, access):
    assert glows_inventory.ssh_access(with_ssh_url(url)) == access


def test_every_api_string_set_as_a_host_var_is_wrapped_unsafe(monkeypatch):
    """On ansible-core 2.18 a plain string from an inventory plugin is templated where it is used (2.19 leaves it
    untrusted by itself): the plugin must hand every one to wrap_var, as community.general's plugins do."""
    from ansible.plugins.loader import inventory_loader

    class Unsafe(str):
        pass

    def mark(value):
        if isinstance(value, dict):
            return {mark(key): mark(item) for key, item in value.items()}
        if isinstance(value, list):
            return [mark(item) for item in value]
        return Unsafe(value) if isinstance(value, str) else value

    class Recorder:
        def __init__(self):
            self.variables = {}

        def add_group(self, name):
            pass

        def add_host(self, name, group=None):
            pass

        def set_variable(self, host, key, value):
            self.variables[key] = value

    module = inventory_loader.get("prima.cluster.glows")
    monkeypatch.setattr(sys.modules[type(module).__module__], "wrap_var", mark)
    module.set_options(direct={"plugin": "prima.cluster.glows", "token": "t"})
    module.inventory = Recorder()
    hosts = glows_inventory.inventory_hosts([with_ssh_url("ssh://a.example:1", remark="{{ 7 * 191 }}",
                                                          hardware={"gpuName": "{{ x }}"}, regionName="TW-03")])
    module._populate(hosts, "http://127.0.0.1:1/sdk/v1")
    strings = {key: value for key, value in module.inventory.variables.items() if isinstance(value, str)}
    assert strings["glows_remark"] == "{{ 7 * 191 }}" and "glows_api_url" in strings
    assert all(isinstance(value, Unsafe) for value in strings.values()), strings


def test_the_cache_belongs_to_one_token(tmp_path, fake):
    """A second account (another token) must not be served the first one's cached listing; and the cache never
    holds the token, not even in a file name."""
    rent(fake, "t-0")
    cache = tmp_path / "cache"
    config = ("cache: true\ncache_plugin: ansible.builtin.jsonfile\ncache_connection: %s\ncache_timeout: 600\n"
              % cache)
    assert listing(inventory(tmp_path, fake, config))["cluster"]["hosts"] == ["t-0"]
    other = inventory(tmp_path, fake, config, env={"GLOWS_SDK_TOKEN": "another-account-token"})
    assert other.returncode != 0 and "refused the token" in other.stderr, other.stdout
    for path in glob.glob(str(cache / "*")):
        assert TOKEN not in path and TOKEN not in open(path).read()
        assert "another-account-token" not in path and "another-account-token" not in open(path).read()
