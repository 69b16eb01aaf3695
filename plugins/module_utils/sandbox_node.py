"""Bring one sandbox node (a network namespace + a chroot running sshd) up or down.

Everything here acts only on what the node owns: the namespace `psb-<name>`, the host
side veth `psbh-<name>`, the mounts under the node's root and the processes whose root
directory is the node's root or that live in its namespace.
"""

import os
import signal
import socket
import subprocess
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

NETNS_PREFIX = "psb-"
HOST_VETH_PREFIX = "psbh-"
IFNAMSIZ = 15


class SandboxError(Exception):
    pass


def netns_name(node: str) -> str:
    return NETNS_PREFIX + node


def host_veth_name(node: str) -> str:
    name = HOST_VETH_PREFIX + node
    if len(name) > IFNAMSIZ:
        raise SandboxError("node name '%s' is too long for an interface name (%s > %d characters); "
                           "use a shorter host name in the sandbox inventory" % (node, name, IFNAMSIZ))
    return name


def unescape_mount_path(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and index + 3 < len(field) and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def mounts_under(mountinfo: str, root: str) -> List[str]:
    """Mount points at or below `root`, deepest (and latest) first: the order to unmount them."""
    root = root.rstrip("/")
    found: List[Tuple[int, int, str]] = []
    for order, line in enumerate(mountinfo.splitlines()):
        fields = line.split()
        if len(fields) < 5:
            continue
        point = unescape_mount_path(fields[4])
        if point == root or point.startswith(root + "/"):
            found.append((point.count("/"), order, point))
    return [point for dummy, dummy, point in sorted(found, reverse=True)]


def pid_roots(proc: str = "/proc") -> Dict[int, str]:
    roots = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            roots[int(entry)] = os.readlink(os.path.join(proc, entry, "root"))
        except OSError:
            continue
    return roots


def pids_rooted_in(roots: Dict[int, str], root: str) -> List[int]:
    root = root.rstrip("/")
    return sorted(pid for pid, path in roots.items() if path == root or path.startswith(root + "/"))


def run(argv: Sequence[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, **kwargs, check=False)
    if check and result.returncode != 0:
        raise SandboxError("%s failed (%d): %s" % (" ".join(argv), result.returncode, result.stderr.strip()))
    return result


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/run/netns", name))


def link_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/sys/class/net", name))


def netns_pids(name: str) -> List[int]:
    if not netns_exists(name):
        return []
    result = run(["ip", "netns", "pids", name], check=False)
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]


def stop_processes(pids_now, grace_seconds: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after the grace period; returns how many were signalled."""
    pids = pids_now()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and pids_now():
        time.sleep(0.1)
    for pid in pids_now():
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and pids_now():
        time.sleep(0.1)
    left = pids_now()
    if left:
        raise SandboxError("processes %s would not stop" % ", ".join(map(str, left)))
    return len(pids)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def read_mountinfo() -> str:
    with open("/proc/self/mountinfo") as handle:
        return handle.read()


def unmount_all(root: str) -> int:
    count = 0
    for point in mounts_under(read_mountinfo(), root):
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point])
        count += 1
    left = mounts_under(read_mountinfo(), root)
    if left:
        raise SandboxError("still mounted under %s: %s" % (root, ", ".join(left)))
    return count


def copy_root(source: str, dest: str, staging: str) -> None:
    """Copy a root filesystem. A live node's root has proc, sys, dev and bind mounts in it: they are not the node's
    files (and /proc cannot be copied). A bind of the root alone (not recursive, read-only) at `staging` shows the
    root's own files, with what the mounts hide (a debootstrapped /dev's device nodes, which chroot needs), and is
    what is copied."""
    source = os.path.realpath(source)
    if not mounts_under(read_mountinfo(), source):
        run(["cp", "-a", "--reflink=auto", source, dest])
        return
    os.makedirs(staging)
    try:
        run(["mount", "--bind", source, staging])
        try:
            run(["mount", "-o", "remount,bind,ro", staging])
            run(["cp", "-a", "--reflink=auto", staging, dest])
        finally:
            run(["umount", staging])
    finally:
        os.rmdir(staging)


class Node:
    def __init__(self, name: str, nodes_dir: str):
        self.name = name
        self.home = os.path.join(nodes_dir, name)
        self.root = os.path.join(self.home, "root")
        self.netns = netns_name(name)
        self.host_veth = host_veth_name(name)

    def exists(self) -> bool:
        return os.path.exists(self.home) or netns_exists(self.netns) or link_exists(self.host_veth)

    def pids(self) -> List[int]:
        own = set(pids_rooted_in(pid_roots(), self.root)) | set(netns_pids(self.netns))
        own.discard(os.getpid())
        return sorted(own)

    def destroy(self) -> bool:
        """Remove every trace of the node; True when there was anything to remove."""
        if not self.exists():
            return False
        stop_processes(self.pids)
        # The home, not only the root: a copy cut short leaves its source's bind there.
        if os.path.exists(self.home):
            unmount_all(self.home)
        if netns_exists(self.netns):
            run(["ip", "netns", "delete", self.netns])
        # Deleting the namespace usually takes the veth pair with it.
        if link_exists(self.host_veth):
            run(["ip", "link", "delete", self.host_veth], check=False)
        if link_exists(self.host_veth):
            raise SandboxError("could not delete the link %s" % self.host_veth)
        if os.path.exists(self.home):
            if mounts_under(read_mountinfo(), self.home):
                raise SandboxError("refusing to delete %s: something is still mounted there" % self.home)
            run(["rm", "-rf", "--one-file-system", self.home])
        return True

    def create(self, pristine: str, address: str, prefix_len: int, bridge: str, gateway: str,
               authorized_key: Optional[str], binds: Iterable[Dict[str, object]],
               root_password: Optional[str] = None) -> None:
        """root_password: the node is like a freshly rented one instead (the fake Glows API's nodes): its own host
        keys, no key authorized, root logs in with this password."""
        os.makedirs(self.home)
        copy_root(pristine, self.root, os.path.join(self.home, "source"))
        self._configure_root(address, authorized_key, root_password)
        self._mount(binds)
        self._network(address, prefix_len, bridge, gateway)
        self._start_sshd(address)

    def create_service(self, address: str, prefix_len: int, bridge: str, gateway: str,
                       argv: Sequence[str], log_path: str) -> int:
        """A namespace with no root filesystem of its own, running one host program (the hub)."""
        os.makedirs(self.home)
        self._network(address, prefix_len, bridge, gateway)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(["ip", "netns", "exec", self.netns] + list(argv), stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, start_new_session=True)
        time.sleep(0.3)
        if process.poll() is not None:
            raise SandboxError("%s exited at once (%s); see %s" % (argv[0], process.returncode, log_path))
        return process.pid

    def create_router(self, address: str, prefix_len: int, bridge: str, gateway: str) -> None:
        """A namespace that only forwards: the access gateway of the mapped topology (its nftables map ports)."""
        os.makedirs(self.home)
        self._network(address, prefix_len, bridge, gateway)
        run(["ip", "netns", "exec", self.netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        # In and out on the same bridge port: redirects would teach clients to skip the gateway.
        run(["ip", "netns", "exec", self.netns, "sysctl", "-q", "-w", "net.ipv4.conf.all.send_redirects=0"])
        run(["ip", "netns", "exec", self.netns, "sysctl", "-q", "-w", "net.ipv4.conf.eth0.send_redirects=0"])

    def _configure_root(self, address: str, authorized_key: Optional[str], root_password: Optional[str] = None) -> None:
        root = self.root
        if root_password is not None:
            # A copy of another node's root (a snapshot) carries that node's host keys and authorized keys.
            ssh_etc = os.path.join(root, "etc/ssh")
            for entry in os.listdir(ssh_etc) if os.path.isdir(ssh_etc) else []:
                if entry.startswith("ssh_host_"):
                    os.remove(os.path.join(ssh_etc, entry))
            for path in (os.path.join(root, "root/.ssh/authorized_keys"), os.path.join(root, "root/.ssh/authorized_keys2")):
                if os.path.lexists(path):
                    os.remove(path)
        _write(os.path.join(root, "etc/hostname"), self.name + "\n")
        _write(os.path.join(root, "etc/hosts"),
               "127.0.0.1 localhost\n%s %s\n" % (address, self.name))
        # No nameserver is reachable from a node (everything is by address). The host's
        # resolv.conf would make each name lookup (Ansible's platform facts look up the
        # FQDN of the hostname, which is the host's) wait 10 s for a timeout.
        _write(os.path.join(root, "etc/resolv.conf"), "# the sandbox has no DNS: nodes reach everything by address\n")
        login = "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        if root_password is not None:
            login = "PermitRootLogin yes\nPasswordAuthentication yes\n"
        _write(os.path.join(root, "etc/ssh/sshd_config.d/sandbox.conf"),
               "ListenAddress %s\n%sUseDNS no\n" % (address, login))
        ssh_dir = os.path.join(root, "root/.ssh")
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        if authorized_key is not None:
            _write(os.path.join(ssh_dir, "authorized_keys"), authorized_key.strip() + "\n", 0o600)
        if root_password is not None:
            if ":" in root_password or "\n" in root_password:
                raise SandboxError("a root password cannot hold ':' or a newline (chpasswd reads user:password lines)")
            run(["chroot", root, "chpasswd"], input="root:%s\n" % root_password)
        os.makedirs(os.path.join(root, "run/sshd"), mode=0o755, exist_ok=True)
        run(["chroot", root, "ssh-keygen", "-A"])

    def _mount(self, binds: Iterable[Dict[str, object]]) -> None:
        root = self.root
        run(["mount", "-t", "proc", "proc", os.path.join(root, "proc")])
        run(["mount", "--rbind", "/sys", os.path.join(root, "sys")])
        run(["mount", "--make-rslave", os.path.join(root, "sys")])
        run(["mount", "--rbind", "/dev", os.path.join(root, "dev")])
        run(["mount", "--make-rslave", os.path.join(root, "dev")])
        for bind in binds:
            target = os.path.join(root, str(bind["dest"]).lstrip("/"))
            os.makedirs(target, exist_ok=True)
            run(["mount", "--bind", str(bind["src"]), target])
            if bind.get("readonly"):
                run(["mount", "-o", "remount,bind,ro", target])

    def _network(self, address: str, prefix_len: int, bridge: str, gateway: str) -> None:
        run(["ip", "netns", "add", self.netns])
        run(["ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", "eth0",
             "netns", self.netns])
        run(["ip", "link", "set", self.host_veth, "master", bridge, "up"])
        in_ns = ["ip", "-n", self.netns]
        run(in_ns + ["link", "set", "lo", "up"])
        run(in_ns + ["addr", "add", "%s/%d" % (address, prefix_len), "dev", "eth0"])
        run(in_ns + ["link", "set", "eth0", "up"])
        run(in_ns + ["route", "add", "default", "via", gateway])
        # The host may still hold the MAC of this address's previous incarnation.
        run(["ip", "neigh", "flush", "to", address, "dev", bridge], check=False)

    def _start_sshd(self, address: str, timeout: float = 30.0) -> None:
        run(["ip", "netns", "exec", self.netns, "chroot", self.root, "/usr/sbin/sshd"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((address, 22), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise SandboxError("sshd of node %s did not answer on %s:22 within %ds" % (self.name, address, timeout))


def _write(path: str, content: str, mode: Optional[int] = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(content)
    if mode is not None:
        os.chmod(path, mode)
