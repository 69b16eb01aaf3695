"""Probe a rank's ports before a run: are they free here, and can this node reach its peers' ports?

Every node runs the probe at the same time: it listens on its own rank ports (a port in use
fails the bind, naming it) while it connects to the ports its peers listen on, retrying
until the peer's listener is up. Python 3.8, standard library only (runs on the nodes).
"""

import errno
import select
import socket
import threading
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


ACK = b"k"
PING = b"p"
CHUNK = 1 << 20


def measure(target: Target, payload_bytes: int, timeout_s: float) -> Tuple[Optional[float], Optional[float], str]:
    """Round trip in ms and, with a payload, throughput in Mbit/s (decimal) to the peer's listener, which
    answers a one-byte ping, then reads the payload and answers one byte; or None and why not. Without a
    payload the round trip is the TCP handshake's; with one it is the ping's, which also holds through an
    SSH forward (whose handshake ends on this node's own loopback)."""
    started = time.monotonic()
    try:
        with socket.create_connection(target, timeout=timeout_s) as sock:
            rtt_ms = (time.monotonic() - started) * 1000.0
            if not payload_bytes:
                return rtt_ms, None, ""
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(max(timeout_s, 30.0))
            pinged = time.monotonic()
            sock.sendall(PING)
            if sock.recv(1) != PING:
                return None, None, "the peer did not answer the ping"
            rtt_ms = (time.monotonic() - pinged) * 1000.0
            chunk, left = b"\0" * CHUNK, payload_bytes
            sending = time.monotonic()
            while left > 0:
                sock.sendall(chunk[:min(left, CHUNK)])
                left -= CHUNK
            if sock.recv(1) != ACK:
                return rtt_ms, None, "the peer closed before reading the whole payload"
            seconds = max(time.monotonic() - sending - rtt_ms / 1000.0, 1e-6)
            return rtt_ms, payload_bytes * 8 / seconds / 1e6, ""
    except OSError as err:
        return None, None, err.strerror or str(err)


class Acceptor(threading.Thread):
    """Accepts peers on the rank's ports while this node probes its own targets; reads each
    peer's payload to the end and answers, so that every node can send at once (a ring)."""

    def __init__(self, listeners: Sequence[socket.socket], payload_bytes: int):
        super().__init__(daemon=True)
        self.listeners, self.payload_bytes = list(listeners), payload_bytes
        self.accepted = {}  # type: Dict[int, List[str]]
        # Peers whose payload was read to the end (or that gave up): only then may the probe end,
        # or a peer still sending (a slow, shaped link) would see its connection reset.
        self.done = {}  # type: Dict[int, List[str]]
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            readable, dummy, dummy = select.select(self.listeners, [], [], 0.1)
            for sock in readable:
                try:
                    conn, peer = sock.accept()
                except OSError:
                    continue
                port = sock.getsockname()[1]
                self.accepted.setdefault(port, []).append(peer[0])
                threading.Thread(target=self.drain, args=(conn, port, peer[0]), daemon=True).start()

    def drain(self, conn: socket.socket, port: int, peer: str) -> None:
        try:
            self.read_payload(conn)
        finally:
            with self.lock:
                self.done.setdefault(port, []).append(peer)

    def read_payload(self, conn: socket.socket) -> None:
        with conn:
            if not self.payload_bytes:
                return
            conn.setblocking(True)
            conn.settimeout(30.0)
            received = 0
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if conn.recv(1) != PING:
                    return
                conn.sendall(PING)
                while received < self.payload_bytes:
                    data = conn.recv(CHUNK)
                    if not data:
                        return
                    received += len(data)
                conn.sendall(ACK)
            except OSError:
                return


def measure_each(targets: Sequence[Target], payload_bytes: int,
                 timeout_s: float) -> List[Tuple[Target, Tuple[Optional[float], Optional[float], str]]]:
    """measure() of every target. Handshakes only: all at once, so that a pass over peers that drop the
    connection takes one timeout, not one per peer. With a payload, one after the other: payloads sent at the
    same time would share the link and each would read a fraction of its throughput."""
    if payload_bytes:
        return [(target, measure(target, payload_bytes, timeout_s)) for target in targets]
    results = {}  # type: Dict[int, Tuple[Optional[float], Optional[float], str]]

    def one(index: int, target: Target) -> None:
        results[index] = measure(target, 0, timeout_s)

    threads = [threading.Thread(target=one, args=(index, target), daemon=True) for index, target in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [(target, results[index]) for index, target in enumerate(targets)]


def probe(address: str, ports: Sequence[int], targets: Sequence[Target], expect: int,
          timeout_s: float, payload_bytes: int = 0, expect_per_port: Optional[Dict[int, int]] = None) -> Dict[str, object]:
    """Listen on `ports`, reach every target (and time a payload to it), and stay until `expect`
    connections per port (or, where given, `expect_per_port[port]`: a port every peer reaches) came in."""
    wanted = {int(port): int((expect_per_port or {}).get(port, (expect_per_port or {}).get(str(port), expect)))
              for port in ports}
    listeners = bind_listeners(address, ports)
    acceptor = Acceptor(listeners, payload_bytes)
    acceptor.start()
    rtt_ms = {}  # type: Dict[str, float]
    throughput = {}  # type: Dict[str, float]
    errors = {}  # type: Dict[str, str]
    deadline = time.monotonic() + timeout_s
    try:
        pending = list(targets)
        while time.monotonic() < deadline:
            for target, (elapsed, mbit_s, why) in measure_each(pending, payload_bytes,
                                                               min(1.0, max(deadline - time.monotonic(), 0.1))):
                key = "%s:%d" % target
                if elapsed is None or (payload_bytes and mbit_s is None):
                    errors[key] = why
                else:
                    rtt_ms[key] = round(elapsed, 3)
                    if mbit_s is not None:
                        throughput[key] = round(mbit_s, 1)
                    errors.pop(key, None)
                    pending.remove(target)
            with acceptor.lock:
                served = all(len(acceptor.done.get(port, [])) >= wanted[port] for port in ports)
            if not pending and served:
                break
            time.sleep(0.05)
    finally:
        acceptor.stopping.set()
        acceptor.join(2.0)
        for sock in listeners:
            sock.close()
    accepted = acceptor.accepted
    return {"rtt_ms": rtt_ms, "throughput_mbit_s": throughput, "unreached": errors,
            "accepted": {str(port): peers for port, peers in sorted(accepted.items())},
            "missing_peers": [port for port in ports if len(accepted.get(port, [])) < wanted[port]]}
