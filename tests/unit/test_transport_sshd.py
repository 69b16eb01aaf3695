"""The forward user against a real sshd: what a peer's cluster key may do on a node, and what it may not.

The test runs its own sshd on 127.0.0.1 (a free port, its own host key and config) with the Match block and
the authorized_keys line the transport role writes (rendered by the same functions), behind an `Include` at
the top of a Debian-like sshd_config whose global settings allow every forward. The forward user is made for
the test (like the role makes it) and removed after, with every process it ran. Needs root and
/usr/sbin/sshd (apt-get install openssh-server).
"""

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import (
    LOOPBACK, SSHD, authorized_key_line, forward_argv, known_hosts_name, sshd_check_argv, sshd_match_block,
    sshd_problems)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: it starts an sshd and makes a user for its forwards"),
    pytest.mark.skipif(not os.access(SSHD, os.X_OK), reason="needs %s: apt-get install openssh-server" % SSHD),
]

# What sshd_config.d of Debian and Ubuntu is read from: the Include comes first, every global setting after it.
MAIN_CONFIG = """Include {base}/sshd_config.d/*.conf
Port {port}
ListenAddress 127.0.0.1
HostKey {base}/ssh_host_ed25519_key
PidFile {base}/sshd.pid
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
AllowAgentForwarding yes
X11Forwarding yes
PermitTunnel yes
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def free_port():
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def listening(port):
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


class EchoServer:
    """A TCP (or Unix socket) server that sends back what it reads, counting the connections it got."""

    def __init__(self, family=socket.AF_INET, address=(LOOPBACK, 0)):
        self.server = socket.socket(family, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(address)
        self.server.listen(8)
        self.address = self.server.getsockname()
        self.accepted = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                connection, dummy = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            with connection:
                while True:
                    data = connection.recv(4096)
                    if not data:
                        break
                    connection.sendall(data)

    def close(self):
        self.server.close()


def user_processes(uid):
    """Pids of the processes running as uid in this process's root and network namespace: what sshd started for
    the test's user (sessions, their commands). Only those: the sandbox's nodes share the machine's pids, and their
    own system user (the transport's prima-tunnel) may have the same uid in their root; killing its sessions
    would cut an integration test's tunnels running beside this suite."""
    own = (os.readlink("/proc/self/root"), os.stat("/proc/self/ns/net").st_ino)
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if (os.readlink("/proc/%s/root" % entry), os.stat("/proc/%s/ns/net" % entry).st_ino) != own:
                    continue
                with open("/proc/%s/status" % entry) as handle:
                    if any(line.split()[1:2] == [str(uid)] for line in handle if line.startswith("Uid:")):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def sshd():
    base = tempfile.mkdtemp(prefix="prima-sshd-")
    os.chmod(base, 0o755)  # sshd reads authorized_keys as the user
    user = "prima-t" + secrets.token_hex(4)
    home = os.path.join(base, "home")
    made_privsep = not os.path.isdir("/run/sshd")
    servers, daemon, uid = [], None, None
    try:
        os.makedirs(os.path.join(home, ".ssh"), mode=0o755)
        os.makedirs(os.path.join(base, "sshd_config.d"))
        # As the role makes it: a system user, /bin/sh for the forced command, a password that is not `!`.
        run(["useradd", "--system", "--no-create-home", "--home-dir", home, "--shell", "/bin/sh",
             "--password", "*", user])
        uid = pwd.getpwnam(user).pw_uid
        # Where the user may write: without its Match block, -R would make a socket here and a command a file.
        writable = os.path.join(base, "writable")
        os.makedirs(writable)
        os.chown(writable, uid, -1)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(base, "ssh_host_ed25519_key")])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "prima-cluster@n0", "-f", os.path.join(base, "id")])
        allowed, unlisted = EchoServer(), EchoServer()
        unix = EchoServer(socket.AF_UNIX, os.path.join(base, "peer.sock"))
        servers = [allowed, unlisted, unix]
        with open(os.path.join(base, "id.pub")) as handle:
            line = authorized_key_line(handle.read(), [allowed.address[1]], "prima-cluster@n0")
        with open(os.path.join(home, ".ssh", "authorized_keys"), "w") as handle:
            handle.write(line + "\n")
        os.chmod(os.path.join(home, ".ssh", "authorized_keys"), 0o644)
        dropin = os.path.join(base, "sshd_config.d", "00-prima-transport.conf")
        with open(dropin, "w") as handle:
            handle.write(sshd_match_block(user))
        port = free_port()
        config = os.path.join(base, "sshd_config")
        with open(config, "w") as handle:
            handle.write(MAIN_CONFIG.format(base=base, port=port))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        daemon = subprocess.Popen([SSHD, "-D", "-f", config, "-E", os.path.join(base, "sshd.log")])
        deadline = time.monotonic() + 10
        while not listening(port):
            assert daemon.poll() is None and time.monotonic() < deadline, "sshd did not start: %s" % \
                open(os.path.join(base, "sshd.log")).read()
            time.sleep(0.05)
        endpoint = {"host": LOOPBACK, "port": port, "user": user}
        with open(os.path.join(base, "ssh_host_ed25519_key.pub")) as handle:
            host_key = " ".join(handle.read().split()[:2])
        known_hosts = os.path.join(base, "known_hosts")
        with open(known_hosts, "w") as handle:
            handle.write("%s %s\n" % (known_hosts_name(endpoint), host_key))
        # The forwarder's own command line, as the role renders it (and so a rogue peer's starting point).
        argv = forward_argv(endpoint, [allowed.address[1]], os.path.join(base, "id"), known_hosts, 5, 3)
        argv[1:1] = ["-F", "/dev/null"]  # nothing of this machine's ssh_config
        yield SimpleNamespace(base=base, user=user, uid=uid, config=config, dropin=dropin, argv=argv,
                              allowed=allowed, unlisted=unlisted, unix=unix, writable=writable,
                              log=os.path.join(base, "sshd.log"))
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(5)
        if uid is not None:
            # Sessions without a pty (a command) outlive their client: end what sshd ran as the test's user.
            for dummy in range(50):
                pids = user_processes(uid)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
                time.sleep(0.1)
            subprocess.run(["userdel", user], check=False, capture_output=True)
        for server in servers:
            server.close()
        shutil.rmtree(base, ignore_errors=True)
        if made_privsep:
            os.rmdir("/run/sshd")


def ssh(sshd, *extra, forwards=True):
    """The forwarder's argv with extra options before the destination; forwards=False drops its -L."""
    argv = list(sshd.argv)
    if not forwards:
        at = argv.index("-L")
        del argv[at:at + 2]
    return argv[:-1] + list(extra) + argv[-1:]


def local_forward(local_port, target):
    """The role forwards each port to the same number; here both ends share one loopback, so it listens elsewhere."""
    return ["-L", "%s:%d:%s" % (LOOPBACK, local_port, target)]


@pytest.fixture
def forwarder(sshd):
    ports = {"allowed": free_port(), "unlisted": free_port(), "unix": free_port()}
    argv = ssh(sshd, *(local_forward(ports["allowed"], "%s:%d" % (LOOPBACK, sshd.allowed.address[1]))
                       + local_forward(ports["unlisted"], "%s:%d" % (LOOPBACK, sshd.unlisted.address[1]))
                       + local_forward(ports["unix"], sshd.unix.address)), forwards=False)
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    deadline = time.monotonic() + 10
    while not all(listening(port) for port in ports.values()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail("the forwarder did not come up (exit %s): %s %s" % (process.returncode, out, err))
        time.sleep(0.05)
    yield SimpleNamespace(process=process, ports=ports)
    process.kill()
    process.wait(5)


def exchange(port, payload=b"ping through the tunnel\n"):
    """What comes back for payload through a local forward (b'' when the peer's sshd refused the channel)."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as connection:
        connection.sendall(payload)
        received = b""
        try:
            while len(received) < len(payload):
                data = connection.recv(4096)
                if not data:
                    break
                received += data
        except ConnectionResetError:
            pass
        return received


def test_sshd_applies_the_match_block_to_the_forward_user_only(sshd):
    # The role's own check, against a config whose global settings allow everything after the Include.
    found = run(sshd_check_argv(sshd.user) + ["-f", sshd.config]).stdout
    assert sshd_problems(found, sshd.user, sshd.dropin) == []
    others = run(sshd_check_argv("root") + ["-f", sshd.config]).stdout
    assert "AllowTcpForwarding yes (wanted local)" in sshd_problems(others, "root", sshd.dropin)[0]


def test_a_forward_to_a_listed_port_carries_bytes_over_a_pty_session_that_only_sleeps(sshd, forwarder):
    assert exchange(forwarder.ports["allowed"]) == b"ping through the tunnel\n"
    assert exchange(forwarder.ports["allowed"], b"x" * 100000) == b"x" * 100000
    assert forwarder.process.poll() is None, "the forwarder's session ended"
    # The forced command runs on a pty (TCP_NODELAY on sshd's side, see FORCED_COMMAND) as the forward user.
    sleeping = []
    for pid in user_processes(sshd.uid):
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            if handle.read().split(b"\0")[:2] == [b"sleep", b"infinity"]:
                with open("/proc/%d/stat" % pid) as stat:
                    sleeping.append(int(stat.read().rsplit(")", 1)[1].split()[4]))
    assert sleeping and all(tty != 0 for tty in sleeping), "no `sleep infinity` of the forward user on a pty"


def test_a_forward_to_an_unlisted_port_or_a_unix_socket_is_refused(sshd, forwarder):
    assert exchange(forwarder.ports["unlisted"]) == b""
    assert exchange(forwarder.ports["unix"]) == b""
    assert sshd.unlisted.accepted == 0 and sshd.unix.accepted == 0
    assert forwarder.process.poll() is None, "a refused channel ended the allowed forwards too"


@pytest.mark.parametrize("listen", ["high", "privileged", "unix"])
def test_a_remote_forward_is_refused(sshd, listen):
    target = "%s:%d" % (LOOPBACK, sshd.allowed.address[1])
    if listen == "unix":
        spec = os.path.join(sshd.writable, "squat.sock")
        where = spec
    else:
        port = free_port() if listen == "high" else 81
        before = listening(port)
        spec = "%s:%d" % (LOOPBACK, port)
        where = "port %d" % port
    result = subprocess.run(ssh(sshd, "-R", "%s:%s" % (spec, target), forwards=False), stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=15, check=False)
    assert result.returncode == 255, (result.returncode, result.stderr)
    assert "remote port forwarding failed" in result.stderr, result.stderr
    if listen == "unix":
        assert not os.path.exists(spec), "the peer's sshd made %s" % where
    else:
        assert listening(port) == before, "the peer's sshd listened on %s" % where


@pytest.mark.parametrize("how", ["command", "shell"])
def test_a_command_or_a_shell_runs_nothing(sshd, how):
    marker = os.path.join(sshd.writable, "ran-" + how)
    script = "id; touch %s\n" % marker
    if how == "command":
        argv = ssh(sshd, script, forwards=False)
        argv.remove("-tt")
        argv.append(argv.pop(-2))  # the command comes after the destination
        stdin = subprocess.DEVNULL
    else:
        argv = ssh(sshd, forwards=False)
        stdin = subprocess.PIPE
    process = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        out, dummy = process.communicate(script.encode() if how == "shell" else None, timeout=1.5)
    except subprocess.TimeoutExpired:
        process.kill()
        out, dummy = process.communicate()
    assert b"uid=" not in out and not os.path.exists(marker), out
