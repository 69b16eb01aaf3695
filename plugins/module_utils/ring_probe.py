"""Probe a rank's ports before a run: are they free here, and can this node reach its peers' ports?

Every node runs the probe at the same time: it listens on its own rank ports (a port in use
fails the bind, naming it) while it connects to the ports its peers listen on, retrying
until the peer's listener is up. Python 3.8, standard library only (runs on the nodes).
"""

import errno
import select
import socket
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

Target = Tuple[str, int]


class ProbeError(Exception):
    pass


def listening_ports(proc_net_tcp: str) -> Set[int]:
    """Ports in state LISTEN (0A) in the text of /proc/net/tcp and /proc/net/tcp6."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def listening_here() -> Set[int]:
    text = ""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                text += handle.read()
        except OSError:
            pass
    return listening_ports(text)


def bind_listeners(address: str, ports: Sequence[int]) -> List[socket.socket]:
    """Listen on each port, refusing ports some process already listens on, on any address
    (a wildcard listener would not stop our bind to one address, but it would take the rank's peers)."""
    listeners = []  # type: List[socket.socket]
    busy = listening_here()
    try:
        for port in ports:
            if port in busy:
                raise ProbeError("port %d on %s is in use: a rank cannot listen there. Find the owner with "
                                 "`ss -ltnp 'sport = :%d'` and stop it" % (port, address, port))
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as err:
                sock.close()
                if err.errno == errno.EADDRINUSE:
                    raise ProbeError("port %d on %s is in use: a rank cannot listen there. Find the owner with "
                                     "`ss -ltnp 'sport = :%d'` and stop it" % (port, address, port))
                raise ProbeError("cannot listen on %s:%d: %s" % (address, port, err.strerror))
            sock.listen(16)
            sock.setblocking(False)
            listeners.append(sock)
    except ProbeError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def try_connect(target: Target, timeout_s: float) -> Tuple[Optional[float], str]:
    """Round-trip of one TCP handshake in ms, or None and why not."""
    started = time.monotonic()
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return (time.monotonic() - started) * 1000.0, ""
    except OSError as err:
        return None, err.strerror or str(err)


def accept_pending(listeners: Sequence[socket.socket], accepted: Dict[int, List[str]], wait_s: float) -> None:
    readable, _, _ = select.select(list(listeners), [], [], max(wait_s, 0.0))
    for sock in readable:
        try:
            conn, peer = sock.accept()
        except OSError:
            continue
        accepted.setdefault(sock.getsockname()[1], []).append(peer[0])
        conn.close()


def probe(address: str, ports: Sequence[int], targets: Sequence[Target], expect: int,
          timeout_s: float) -> Dict[str, object]:
    """Listen on `ports`, reach every target, and stay until `expect` connections per port came in."""
    listeners = bind_listeners(address, ports)
    accepted = {}  # type: Dict[int, List[str]]
    rtt_ms = {}  # type: Dict[str, float]
    errors = {}  # type: Dict[str, str]
    deadline = time.monotonic() + timeout_s
    try:
        pending = list(targets)
        while time.monotonic() < deadline:
            for target in list(pending):
                elapsed, why = try_connect(target, min(1.0, max(deadline - time.monotonic(), 0.1)))
                key = "%s:%d" % target
                if elapsed is None:
                    errors[key] = why
                else:
                    rtt_ms[key] = round(elapsed, 3)
                    errors.pop(key, None)
                    pending.remove(target)
            accept_pending(listeners, accepted, 0.1)
            if not pending and all(len(accepted.get(port, [])) >= expect for port in ports):
                break
    finally:
        for sock in listeners:
            sock.close()
    return {"rtt_ms": rtt_ms, "unreached": errors,
            "accepted": {str(port): peers for port, peers in sorted(accepted.items())},
            "missing_peers": [port for port in ports if len(accepted.get(port, [])) < expect]}
