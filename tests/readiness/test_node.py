"""Per node: toolchain, libraries, builds at the pinned commits, weights, launch units, disk, ports."""

import pytest

from ansible_collections.prima.cluster.plugins.module_utils.ring_probe import listening_ports
from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.readiness import (
    compiler_command, expected_weights, version_at_least)
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import listen_ports
from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import (
    merged_catalog, models_files, models_selection)


def prima_built(node) -> bool:
    return bool(node.var("prima_enabled", True))


def test_compiler(host, node):
    build = node.facts.get("llama_cpp") or node.facts.get("prima")
    assert build, "no build recorded in /etc/ansible/facts.d: run site.yml"
    command = compiler_command(build.get("compiler", ""))
    result = host.run("%s --version" % command)
    assert result.rc == 0, "the compiler the builds used, %r, does not run: %s" % (command, result.stderr.strip())


def test_libzmq(host, node):
    found = host.run("pkg-config --modversion libzmq").stdout.strip()
    minimum = str(node.var("zeromq_min_version", "4.3.2"))
    assert version_at_least(found, minimum), "libzmq is %r, prima.cpp needs >= %s" % (found or "absent", minimum)


def test_highs(host, node):
    prefix = node.var("highs_prefix", "/usr/local")
    assert "libhighs.so" in host.run("/sbin/ldconfig -p").stdout, "the loader does not know libhighs.so: run ldconfig"
    assert host.file("%s/include/highs/Highs.h" % prefix).exists, "no HiGHS headers in %s/include/highs" % prefix


def binary_problems(host, fact, bin_dir):
    """Every binary the build recorded (the pinned_build fact: binaries by name), present and unchanged."""
    problems = []
    for name, recorded in sorted((fact.get("binaries") or {}).items()):
        path = "%s/%s" % (bin_dir, name)
        binary = host.file(path)
        if not binary.exists:
            problems.append("%s is missing" % path)
        elif binary.sha256sum != recorded:
            problems.append("%s differs from the build (sha256 %s, built %s): run site.yml"
                            % (path, binary.sha256sum[:12], recorded[:12]))
    return problems


def test_prima_build(host, node):
    if not prima_built(node):
        pytest.skip("prima.cpp is not built on this inventory (prima_enabled is false)")
    fact = node.facts.get("prima")
    assert fact, "no prima.cpp build recorded (/etc/ansible/facts.d/prima.fact): run site.yml"
    expected = str(node.var("prima_version"))
    assert fact["commit"] == expected, "prima.cpp is at %s, the inventory pins %s: run site.yml" % (
        fact["commit"][:12], expected[:12])
    bin_dir = "%s/current/bin" % node.var("prima_root", "/opt/prima")
    cli = bin_dir + "/llama-cli"
    problems = binary_problems(host, fact, bin_dir)
    assert not problems, "; ".join(problems)
    version = host.run("%s --version" % cli)
    assert version.rc == 0, "%s --version fails: %s" % (cli, version.stderr.strip()[-300:])


def test_llama_cpp_build(host, node):
    fact = node.facts.get("llama_cpp")
    assert fact, "no llama.cpp build recorded (/etc/ansible/facts.d/llama_cpp.fact): run site.yml"
    if node.var("llama_cpp_source") == "sdist":
        expected = str(node.var("llama_cpp_sdist_commit"))
        assert fact["commit"].startswith(expected), \
            "llama.cpp is at %s, the inventory pins %s" % (fact["commit"], expected)
    else:
        expected = str(node.var("llama_cpp_git_version"))
        assert fact["version"] == expected, "llama.cpp is %s, the inventory pins %s" % (fact["version"], expected)
    bin_dir = "%s/current/bin" % node.var("llama_cpp_root", "/opt/llama.cpp")
    problems = binary_problems(host, fact, bin_dir)
    assert not problems, "; ".join(problems)
    version = host.run("%s/llama-completion --version" % bin_dir)
    assert version.rc == 0, "llama-completion --version fails: %s" % version.stderr.strip()[-300:]


def test_fio(host):
    assert host.exists("fio"), "fio is not on PATH (prima.cpp's profiler needs it): run site.yml"


def test_link_sweep_tools(host, node):
    assert host.exists("tc"), "tc (iproute2) is not on PATH (bench.yml -e links=... shapes with it): run site.yml"
    guard = node.var("link_guard_script")
    assert host.file(guard).is_file and host.file(guard).mode & 0o111, \
        "%s is missing (it takes an interrupted sweep's shaping off): run site.yml" % guard
    assert not host.file(node.var("link_marker")).exists, \
        "%s exists: a sweep's shaping is still on; %s remove" % (node.var("link_marker"), guard)


def test_cuda(host, node):
    builds = [fact for fact in (node.facts.get("prima"), node.facts.get("llama_cpp")) if fact and fact.get("cuda")]
    if not builds and not host.exists("nvidia-smi"):
        pytest.skip("no GPU and no CUDA build on this node")
    smi = host.run("nvidia-smi")
    assert smi.rc == 0, "nvidia-smi fails: %s" % (smi.stderr or smi.stdout).strip()[-300:]
    for fact in builds:
        binary = "%s/bin/%s" % (fact["prefix"], "llama-cli")
        linked = host.run("ldd %s" % binary).stdout
        missing = [lib for lib in ("libcudart", "libcublas") if lib not in linked]
        assert not missing, "%s does not link %s" % (binary, ", ".join(missing))


def weights_records(node):
    catalog = merged_catalog(node.var("models_catalog", {}), node.var("models_extra_catalog", {}))
    keys = models_selection(node.var("model"), node.var("models_enabled", []), catalog)
    lock_path = node.var("models_lock_file")
    lock = {}
    if lock_path:
        try:
            import json
            with open(lock_path) as handle:
                lock = json.load(handle)
        except FileNotFoundError:
            pass
    files = models_files(keys, catalog, lock, node.var("models_hub_endpoint", ""))
    return expected_weights(files, node.var("cluster_models_dir"))


def test_weights(host, node):
    problems = []
    for record in weights_records(node):
        weights = host.file(record["path"])
        if not weights.exists:
            problems.append("%s is missing" % record["path"])
            continue
        if record["size"] and weights.size != record["size"]:
            problems.append("%s has %d bytes, %d expected (lock file, else catalog)"
                            % (record["path"], weights.size, record["size"]))
        # The same check site.yml makes: the verified stamp, or the file's sha256 when it changed since.
        result = host.ansible("prima.cluster.hub_download", "url=none dest=%s sha256=%s verify_only=true"
                              % (record["path"], record["sha256"]), check=False)
        if not result.get("verified"):
            problems.append("%s does not match its sha256 %s" % (record["path"], record["sha256"][:12] or "(none)"))
    assert not problems, "; ".join(problems) + ": run site.yml"


def test_launch_units(host, node):
    launch_dir = node.var("cluster_launch_dir")
    units = sorted(name for name in host.run("ls %s" % launch_dir).stdout.split() if name.endswith(".sh"))
    assert units, "no launch units in %s: run site.yml" % launch_dir
    problems = []
    for unit in units:
        check = host.run("bash -n %s/%s" % (launch_dir, unit))
        if check.rc != 0:
            problems.append("%s: %s" % (unit, check.stderr.strip()))
        if host.exists("systemctl") and host.run("systemctl is-system-running").stdout.strip() not in ("", "offline"):
            service = "/etc/systemd/system/prima-bench-%s.service" % unit[:-3]
            verify = host.run("systemd-analyze verify %s" % service)
            if verify.rc != 0:
                problems.append("%s: %s" % (service, verify.stderr.strip()))
    assert not problems, "; ".join(problems)


def test_free_disk(host, node):
    models_dir = node.var("cluster_models_dir")
    margin_gib = float(node.var("models_disk_margin_gib", 5))
    available = int(host.run("df -B1 --output=avail %s | tail -1" % models_dir).stdout.strip() or 0)
    assert available >= margin_gib * 1024 ** 3, "%.2f GiB free on %s, below the margin of %.2f GiB" % (
        available / 1024 ** 3, models_dir, margin_gib)


def test_rank_ports_free(host, node, cluster_plans):
    plans, dummy = cluster_plans
    ports = listen_ports({plan["name"]: plan for plan in plans}, node.name)
    busy = sorted(set(ports) & listening_ports(host.run("cat /proc/net/tcp /proc/net/tcp6").stdout))
    assert not busy, "%s's rank port(s) %s are in use outside a run: find the owner with ss -ltnp" % (
        node.name, ", ".join(map(str, busy)))
