"""How cross-node connections travel: straight to each peer's cluster_ip, or through SSH port forwards.

Glows reaches each instance only through a port-mapped SSH gateway and promises nothing about
instance-to-instance traffic. Every port a rank, the weights fan-out or the probe connects to is
`base + rank` (or one fixed port), so no two ranks share a port: a node can forward each port it
needs on a peer to the same port on that peer's loopback, next to its own listeners. Pure functions.
"""

import dataclasses
import re
import shlex
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

NETWORKS = ("auto", "direct", "ssh")
LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class PortBases:
    data: int
    signal: int
    rpc: int
    fanout: int


def rank_order(ranks: Mapping[str, Any]) -> List[str]:
    return sorted(ranks, key=lambda host: (int(ranks[host]), host))


def rpc_port(rpc_base: int, rank: int) -> int:
    """ggml-rpc-server of worker rank R (R >= 1) listens on rpc_base + R - 1: the first worker keeps llama.cpp's port."""
    return rpc_base + rank - 1


def listen_uses(ranks: Mapping[str, Any], bases: PortBases) -> List[Tuple[str, int, str]]:
    """(host, port, what) for everything a host may listen on, whatever the world size."""
    uses = []  # type: List[Tuple[str, int, str]]
    for index, host in enumerate(rank_order(ranks)):
        uses += [(host, bases.data + index, "prima.cpp data port of rank %d" % index),
                 (host, bases.signal + index, "prima.cpp signal port of rank %d" % index),
                 (host, bases.fanout, "weights fan-out server")]
        if index > 0:
            uses.append((host, rpc_port(bases.rpc, index), "ggml-rpc-server of rank %d" % index))
    return uses


def listen_table(ranks: Mapping[str, Any], bases: PortBases) -> Dict[str, Dict[int, str]]:
    """What every host may listen on: port -> what it is."""
    table = {}  # type: Dict[str, Dict[int, str]]
    for host, port, what in listen_uses(ranks, bases):
        table.setdefault(host, {})[port] = what
    return table


def needed_ports(ranks: Mapping[str, Any], bases: PortBases, allocator: bool = False) -> Dict[str, Dict[str, List[int]]]:
    """host -> peer -> the ports the host connects to on that peer, over every world size (-e world=N takes
    the first N ranks, so rank R's next is R+1, or rank 0 when R is the last):

    - prima.cpp: the next rank's data and signal ports, and rank 0's (the master, and the next of the last rank);
      with prima.cpp's own allocator a rank may skip ranks left without layers, so every peer's;
    - llama.cpp RPC: rank 0, the head, each worker's RPC port;
    - the weights fan-out, from whichever node is its source, and the probe of all of these.
    """
    hosts = rank_order(ranks)
    needs = {}  # type: Dict[str, Dict[str, List[int]]]
    for rank, host in enumerate(hosts):
        for peer_rank, peer in enumerate(hosts):
            if peer == host:
                continue
            ports = {bases.fanout}
            if peer_rank in (rank + 1, 0) or allocator:
                ports |= {bases.data + peer_rank, bases.signal + peer_rank}
            if rank == 0:
                ports.add(rpc_port(bases.rpc, peer_rank))
            needs.setdefault(host, {})[peer] = sorted(ports)
    return needs


def port_problems(ranks: Mapping[str, Any], bases: PortBases, allocator: bool = False) -> List[str]:
    """Ports that two uses would share on one node (a listener and a forward, or two forwards), or out of range."""
    problems = []  # type: List[str]
    listens = listen_table(ranks, bases)
    owners = {}  # type: Dict[int, List[str]]
    for host, port, what in listen_uses(ranks, bases):
        if port == bases.fanout and what != "weights fan-out server":
            problems.append("port %d is both the weights fan-out server and the %s: change cluster_fanout_port"
                            % (port, what))
        elif port != bases.fanout:
            owners.setdefault(port, []).append("%s on %s" % (what, host))
    for port, uses in sorted(owners.items()):
        if len(uses) > 1:
            problems.append("port %d is both the %s: give cluster_data_port_base, cluster_signal_port_base, "
                            "cluster_rpc_port and cluster_fanout_port ranges that do not overlap"
                            % (port, " and the ".join(uses)))
    for host, ports in sorted(listens.items()):
        bad = sorted(port for port in ports if not 1024 <= port <= 65535)
        if bad:
            problems.append("%s: port(s) %s are outside 1024-65535: lower the port bases" % (host, bad))
    if problems:
        return problems
    # A node forwards each port it needs to one peer, on its own loopback beside its own listeners.
    for host, peers in sorted(needed_ports(ranks, bases, allocator).items()):
        forwarded = {}  # type: Dict[int, str]
        for peer, ports in sorted(peers.items()):
            for port in ports:
                if port == bases.fanout:
                    continue
                if port in listens[host]:
                    problems.append("%s: port %d is its own %s and a forward to %s" % (host, port, listens[host][port], peer))
                elif forwarded.get(port, peer) != peer:
                    problems.append("%s: port %d would forward to both %s and %s" % (host, port, forwarded[port], peer))
                forwarded[port] = peer
    return problems


def rank_links(needs: Mapping[str, Mapping[str, Sequence[int]]], bases: PortBases) -> Dict[str, Dict[str, List[int]]]:
    """The forwards the ranks and the probe use: every needed port but the fan-out's."""
    return {host: {peer: [port for port in ports if port != bases.fanout] for peer, ports in peers.items()}
            for host, peers in needs.items()}


# The forwarder's session: a pty makes sshd set TCP_NODELAY on the connection (it does so for interactive
# sessions only). Without it, sshd's Nagle holds each small reply until the client's delayed ACK: a
# request/response through the tunnel took 15-19 ms on the sandbox, 0.45 ms with the pty. The session runs
# this forced command and nothing else.
FORCED_COMMAND = "exec sleep infinity"

SSHD = "/usr/sbin/sshd"

# What the peers' keys log in as: a user of its own, never root. An authorized_keys line cannot allow -L
# without -R (`port-forwarding` grants both; `permitlisten` does not cover Unix sockets), and a -R as root
# made the peer's sshd listen on any port, 81 included, or make a root-owned socket at any path. sshd can
# refuse both for one user, in a Match block (sshd_match_block).
USER_PATTERN = r"[a-z_][a-z0-9_-]{0,31}"

# The forward user's sshd settings, in this order in its Match block, and as `sshd -T` prints them.
SSHD_FORWARD_SETTINGS = (
    ("AllowTcpForwarding", "local"),  # -L only: a -R would make the peer's sshd listen for this node
    ("AllowStreamLocalForwarding", "no"),  # -L and -R to Unix sockets, which permitopen/permitlisten miss
    ("PermitListen", "none"),
    ("PermitOpen", LOOPBACK + ":*"),  # the key's permitopen narrows it to the ports it needs
    ("X11Forwarding", "no"),
    ("AllowAgentForwarding", "no"),
    ("PermitTunnel", "no"),
    ("PermitTTY", "yes"),  # the forwarder's pty: TCP_NODELAY (FORCED_COMMAND)
    ("ForceCommand", FORCED_COMMAND),  # also where a key line lacks command=, and for subsystems (sftp)
)


def authorized_key_line(public_key: str, ports: Iterable[int], comment: str) -> str:
    """The forward user's authorized_keys line for one peer's key: forwards to these loopback ports, and a pty
    session that can only sleep (for TCP_NODELAY, above). `port-forwarding` also grants -R as far as the key
    goes: the user's Match block (sshd_match_block) is what refuses it."""
    key = public_key.strip().split()
    if len(key) < 2 or not re.fullmatch(r"[A-Za-z0-9@.-]+", key[0]) or not re.fullmatch(r"[A-Za-z0-9+/=]+", key[1]):
        raise ValueError("not an OpenSSH public key: %r" % public_key[:60])
    if not re.fullmatch(r"[A-Za-z0-9@._-]+", comment):
        raise ValueError("key comment %r has characters an authorized_keys line cannot carry" % comment)
    opens = ",".join('permitopen="%s:%d"' % (LOOPBACK, int(port)) for port in sorted(set(ports)))
    return 'restrict,pty,command="%s",port-forwarding,%s %s %s %s' % (FORCED_COMMAND, opens, key[0], key[1], comment)


def ssh_endpoint(hostvars: Mapping[str, Any], peer: str) -> Dict[str, Any]:
    """How a node reaches a peer's sshd: cluster_ssh_host/port/user, else the peer's own Ansible connection."""
    values = hostvars[peer]
    host = values.get("cluster_ssh_host") or values.get("ansible_host") or peer
    port = values.get("cluster_ssh_port") or values.get("ansible_port") or 22
    user = values.get("cluster_ssh_user") or values.get("ansible_user") or "root"
    for name, value in (("cluster_ssh_host", host), ("cluster_ssh_user", user)):
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", str(value)):
            raise ValueError("host %s: %s %r is not a host or user name; set %s to the address other nodes reach "
                             "its sshd on" % (peer, name, value, name))
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise ValueError("host %s: cluster_ssh_port %r is not a port number" % (peer, port))
    if not 0 < port < 65536:
        raise ValueError("host %s: cluster_ssh_port %d is not a port number" % (peer, port))
    return {"host": str(host), "port": port, "user": str(user)}


def forward_user_problems(user: str, hosts: Sequence[str], hostvars: Mapping[str, Any]) -> List[str]:
    """transport_user is one user name for the whole cluster, and not a user Ansible or the serve control log
    in as (its Match block forces a command that only sleeps)."""
    user = str(user)
    if not re.fullmatch(USER_PATTERN, user) or user == "root":
        return ["transport_user %r is not a user name the forwards may log in as: give a new, unprivileged user "
                "name (lower-case letters, digits, _ and -, not root)" % user]
    problems = []  # type: List[str]
    others = sorted(host for host in hosts if str(hostvars[host].get("transport_user", user)) != user)
    if others:
        problems.append("transport_user differs between hosts (%s): it is one user for the whole cluster; set it in "
                        "group_vars or with -e" % ", ".join(others))
    for host in hosts:
        try:
            login = ssh_endpoint(hostvars, host)["user"]
        except ValueError:
            continue  # the transport's own check names a bad endpoint
        if login == user:
            problems.append("host %s: transport_user %r is the user Ansible and the serve control log in as; the "
                            "forwards' user may only sleep and forward, so give transport_user another name"
                            % (host, user))
    return problems


def checked_forward_user(user: str) -> str:
    """The user, or ValueError when it is no user name the forwards may log in as (what goes into sshd's
    configuration and the node-side commands)."""
    if not re.fullmatch(USER_PATTERN, user) or user == "root":
        raise ValueError("transport_user %r is not a user name the forwards may log in as" % user)
    return user


def sshd_match_block(user: str) -> str:
    """The sshd_config block that lets the forward user open -L forwards to loopback over a pty session that only
    sleeps, and nothing else. Match values win over global ones wherever the block stands; a Match block in a
    file that `Include` pulls in ends with that file (OpenSSH 8.2 and later), so it may sit in sshd_config.d."""
    checked_forward_user(user)
    return "Match User %s\n%s" % (user, "".join("\t%s %s\n" % setting for setting in SSHD_FORWARD_SETTINGS))


def sshd_check_argv(user: str) -> List[str]:
    """`sshd -T` for a connection of the forward user: what sshd would apply, read from its files."""
    return [SSHD, "-T", "-C", "user=%s,host=prima-cluster-peer,addr=%s" % (user, LOOPBACK)]


def setup_state_argv(user: str, paths: Sequence[str]) -> List[str]:
    """One read-only command that prints what a transport setup leaves on a node: the forward user's account, each
    path's type, owner, group and mode, each regular file's sha256, and what sshd applies to the forward user.

    site.yml records the digest of its output after a setup and sets up again where it differs (a file edited or
    removed, a mode changed, an sshd configuration that no longer applies the forward user's block). The paths and
    the user are arguments of the script, never part of its text.
    """
    checked_forward_user(user)
    # stat's %F and every tool's messages are translated: the controller's locale travels over SSH (AcceptEnv).
    script = ('LC_ALL=C; export LC_ALL; user=$1; shift; getent passwd "$user" || echo "no user $user"; '
              'for path in "$@"; do stat -c "%n %F %U %G %a" -- "$path" 2>&1; '
              'if [ -f "$path" ]; then sha256sum -- "$path" 2>&1; fi; done; '
              + " ".join(shlex.quote(part) for part in sshd_check_argv(user)) + " 2>&1; exit 0")
    return ["sh", "-c", script, "prima-transport-state", user] + [str(path) for path in paths]


def sshd_settings(text: str) -> Dict[str, List[str]]:
    """`sshd -T` output: keyword (lower case) -> its values, one a line."""
    settings = {}  # type: Dict[str, List[str]]
    for line in text.splitlines():
        keyword, dummy, value = line.strip().partition(" ")
        if keyword:
            settings.setdefault(keyword.lower(), []).append(value.strip())
    return settings


def sshd_problems(text: str, user: str, config: str) -> List[str]:
    """What `sshd -T` (sshd_check_argv) says the forward user may do beyond SSHD_FORWARD_SETTINGS, and the fix."""
    settings = sshd_settings(text)
    problems = []  # type: List[str]
    for keyword, wanted in SSHD_FORWARD_SETTINGS:
        found = settings.get(keyword.lower(), [])
        if found != [wanted]:
            problems.append("%s %s (wanted %s)" % (keyword, " ".join(found) or "unset", wanted))
    if not problems:
        return []
    return ["sshd applies to the forward user %s: %s. %s holds the right values, so either sshd_config does not "
            "read it (add `Include %s/*.conf` at the top of /etc/ssh/sshd_config) or an earlier Match block that "
            "matches %s sets these first (restrict it to other users)"
            % (user, "; ".join(problems), config, config.rsplit("/", 1)[0], user)]


def known_hosts_name(endpoint: Mapping[str, Any]) -> str:
    return endpoint["host"] if int(endpoint["port"]) == 22 else "[%s]:%d" % (endpoint["host"], int(endpoint["port"]))


def forward_endpoint(hostvars: Mapping[str, Any], peer: str, user: str) -> Dict[str, Any]:
    """Where a forwarder reaches a peer's sshd (ssh_endpoint), as the forward user, whoever Ansible logs in as."""
    if not re.fullmatch(USER_PATTERN, str(user)) or user == "root":
        raise ValueError("transport_user %r is not a user name the forwards may log in as" % user)
    return dict(ssh_endpoint(hostvars, peer), user=str(user))


def forward_argv(endpoint: Mapping[str, Any], ports: Sequence[int], key: str, known_hosts: str,
                 alive_interval_s: int, alive_count: int) -> List[str]:
    """One supervised SSH connection per peer link (endpoint: forward_endpoint): every port, at the same number
    on both loopbacks."""
    # -tt: a pty session (the peer runs only its forced command) so that both ends set TCP_NODELAY.
    # AES-GCM first: with AES-NI a small message's round trip was 0.37 ms against chacha20-poly1305's 0.47 ms.
    argv = ["ssh", "-tt", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
            "-o", "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com",
            "-o", "ServerAliveInterval=%d" % alive_interval_s, "-o", "ServerAliveCountMax=%d" % alive_count,
            "-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes", "-o", "IdentityFile=%s" % key,
            "-o", "UserKnownHostsFile=%s" % known_hosts, "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "HostKeyAlgorithms=ssh-ed25519", "-o", "LogLevel=ERROR",
            # The known_hosts file is the setup's (site.yml compares it with its record): ssh adds nothing to it,
            # not the address behind a host name (CheckHostIP, on by default before OpenSSH 8.5), nor new keys.
            "-o", "CheckHostIP=no", "-o", "UpdateHostKeys=no",
            "-p", str(endpoint["port"])]
    for port in sorted(ports):
        argv += ["-L", "%s:%d:%s:%d" % (LOOPBACK, port, LOOPBACK, port)]
    return argv + ["%s@%s" % (endpoint["user"], endpoint["host"])]


def shell_argv(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(arg)) for arg in argv)


def probe_targets(needs: Mapping[str, Mapping[str, Sequence[int]]], hostvars: Mapping[str, Any],
                  host: str, among: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """For `auto`: listen on every port peers need here, on cluster_ip, and reach every port needed on each peer
    (of the hosts `among`, those that probe at the same time: the play's)."""
    among = list(needs) if among is None else list(among)
    reached_by = {}  # type: Dict[int, int]
    for peer, peers in needs.items():
        for port in peers.get(host, []) if peer != host and peer in among else []:
            reached_by[port] = reached_by.get(port, 0) + 1
    targets = ["%s:%d" % (hostvars[peer].get("cluster_ip"), port)
               for peer, ports in sorted(needs.get(host, {}).items()) if peer in among for port in ports]
    # Each listener stays until every peer that needs it came, so a late peer does not find it closed.
    expect = {str(port): count for port, count in sorted(reached_by.items())}
    return {"ports": sorted(reached_by), "targets": targets, "expect_per_port": expect}


def choose(setting: str, hosts: Sequence[str], hostvars: Mapping[str, Any],
           probes: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, str]:
    """The transport, and why: `direct` or `ssh` as set, or for `auto` what the direct probe found."""
    if setting not in NETWORKS:
        raise ValueError("cluster_network %r is not one of %s" % (setting, ", ".join(NETWORKS)))
    if setting != "auto":
        return {"mode": setting, "setting": setting, "reason": "cluster_network=%s" % setting}
    if len(hosts) < 2:
        return {"mode": "direct", "setting": setting, "reason": "auto: one node in the play, nothing crosses nodes"}
    missing = [host for host in hosts if not hostvars[host].get("cluster_ip")]
    if missing:
        return {"mode": "ssh", "setting": setting,
                "reason": "auto: no cluster_ip for %s, so only SSH is known to reach them" % ", ".join(missing)}
    failures = []  # type: List[str]
    for host in hosts:
        result = (probes or {}).get(host) or {}
        if result.get("failed") or "unreached" not in result:
            failures.append("%s: the probe failed (%s)" % (host, str(result.get("msg") or "no result").splitlines()[0]))
            continue
        for target, why in sorted((result.get("unreached") or {}).items()):
            failures.append("%s cannot reach %s (%s)" % (host, target, why))
    if failures:
        more = " and %d more" % (len(failures) - 3) if len(failures) > 3 else ""
        return {"mode": "ssh", "setting": setting,
                "reason": "auto: %s%s; SSH port forwards carry the cluster" % ("; ".join(failures[:3]), more)}
    return {"mode": "direct", "setting": setting,
            "reason": "auto: every node reached every port it needs on its peers' cluster_ip"}


def network_problems(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> List[str]:
    """cluster_network is one value for the whole cluster."""
    values = {}  # type: Dict[str, List[str]]
    for host in hosts:
        values.setdefault(str(hostvars[host].get("cluster_network", "auto")), []).append(host)
    problems = ["cluster_network %r (hosts %s) is not one of %s" % (value, ", ".join(owners), ", ".join(NETWORKS))
                for value, owners in sorted(values.items()) if value not in NETWORKS]
    if len(values) > 1:
        found = "; ".join("%s: %s" % (value, ", ".join(owners)) for value, owners in sorted(values.items()))
        problems.append("cluster_network differs between hosts (%s): it is one value for the whole cluster; set it "
                        "in group_vars or with -e" % found)
    return problems


def port_owners(plan: Mapping[str, Any]) -> Dict[int, Tuple[str, int]]:
    """port -> (host, rank) of the rank that listens on it in this plan."""
    owners = {}  # type: Dict[int, Tuple[str, int]]
    for host, unit in plan["units"].items():
        for port in unit.get("listen") or []:
            owners[int(port)] = (host, int(unit["rank"]))
    return owners


def drop_problems(plan: Mapping[str, Any], drops: Mapping[str, Sequence[Mapping[str, Any]]]) -> List[str]:
    """Tunnels that dropped during a run, one line per link, each with the ranks whose connections it carried."""
    owners = port_owners(plan)
    problems = []
    for host in plan["hosts"]:
        by_peer = {}  # type: Dict[str, List[Mapping[str, Any]]]
        for drop in drops.get(host) or []:
            by_peer.setdefault(str(drop.get("peer")), []).append(drop)
        for peer, events in sorted(by_peer.items()):
            ports = sorted({int(port) for drop in events for port in drop.get("ports") or []
                            if int(port) in owners and owners[int(port)][0] == peer})
            broken = sorted({(owners[port][1], owners[port][0]) for port in ports})
            if not broken:
                continue
            rank = plan["units"][host]["rank"]
            carried = ", ".join("rank %d (%s) -> rank %d (%s)" % (rank, host, peer_rank, owner)
                                for peer_rank, owner in broken)
            first = min(events, key=lambda drop: float(drop.get("after_s") or 0.0))
            again = " and %d more time(s) as it was started again" % (len(events) - 1) if len(events) > 1 else ""
            problems.append("the SSH tunnel %s -> %s (port %s) dropped during the run (ssh exited %s, %.1f s in%s): "
                            "it carried %s" % (host, peer, ", ".join(str(port) for port in ports), first.get("exit"),
                                               float(first.get("after_s") or 0.0), again, carried))
    return problems
