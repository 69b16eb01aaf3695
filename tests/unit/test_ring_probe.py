"""The port probe, on loopback: two ranks probing each other at once, a port in use, an unreachable peer."""

import socket
import threading
import time

import pytest

from ansible_collections.prima.cluster.plugins.module_utils import ring_probe
from ansible_collections.prima.cluster.plugins.module_utils.ring_probe import ACK, PING, ProbeError, probe


def free_ports(count):
    sockets = [socket.socket() for dummy in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def test_two_ranks_reach_each_other():
    a, b = free_ports(2)
    results = {}

    def rank(name, own, peer):
        results[name] = probe("127.0.0.1", [own], [("127.0.0.1", peer)], 1, 10)

    threads = [threading.Thread(target=rank, args=("a", a, b)), threading.Thread(target=rank, args=("b", b, a))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, own, peer in (("a", a, b), ("b", b, a)):
        assert results[name]["unreached"] == {} and results[name]["missing_peers"] == []
        assert list(results[name]["rtt_ms"]) == ["127.0.0.1:%d" % peer]
        assert results[name]["accepted"] == {str(own): ["127.0.0.1"]}


def test_a_ring_of_three_sends_payloads_at_once():
    ports = free_ports(3)
    results = {}

    def rank(index):
        results[index] = probe("127.0.0.1", [ports[index]], [("127.0.0.1", ports[(index + 1) % 3])], 1, 20,
                               payload_bytes=8 << 20)

    threads = [threading.Thread(target=rank, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index in range(3):
        target = "127.0.0.1:%d" % ports[(index + 1) % 3]
        assert results[index]["unreached"] == {} and results[index]["missing_peers"] == []
        assert results[index]["throughput_mbit_s"][target] > 0 and target in results[index]["rtt_ms"]


def assert_probe_refuses_a_port_held_on(address):
    """Someone else listens on `address`: the probe on 127.0.0.1 names the port as in use."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((address, 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(ProbeError, match="port %d on 127.0.0.1 is in use" % port):
            probe("127.0.0.1", [port], [], 0, 1)


def test_port_in_use_is_named():
    assert_probe_refuses_a_port_held_on("127.0.0.1")


def test_unreached_peer_and_missing_connections_are_reported():
    own, nobody = free_ports(2)
    result = probe("127.0.0.1", [own], [("127.0.0.1", nobody)], 1, 1)
    assert "127.0.0.1:%d" % nobody in result["unreached"] and result["missing_peers"] == [own]


def test_a_wildcard_listener_counts_as_in_use():
    assert_probe_refuses_a_port_held_on("0.0.0.0")


def test_the_probe_stays_until_a_slow_peer_has_sent_its_payload():
    # A shaped link: the peer's payload takes a while. Ending at accept() would reset its connection.
    (port,) = free_ports(1)
    payload = 256 * 1024
    results = {}
    listener = threading.Thread(target=lambda: results.update(probe("127.0.0.1", [port], [], 1, 10, payload)))
    listener.start()
    for dummy in range(100):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            threading.Event().wait(0.05)
    alive_while_sending = []
    with sock:
        sock.settimeout(5)
        sock.sendall(PING)  # the round trip first: a one-byte ping, answered at once
        assert sock.recv(1) == PING
        for dummy in range(8):  # 8 x 32 KiB over 0.8 s
            sock.sendall(b"\0" * (32 * 1024))
            threading.Event().wait(0.1)
            alive_while_sending.append(listener.is_alive())
        # A module process ends when probe() returns, and its reading threads with it.
        assert all(alive_while_sending[:-1]), alive_while_sending
        sock.settimeout(5)
        assert sock.recv(1) == ACK  # the peer read it all and answered, no reset
    listener.join()
    assert results["missing_peers"] == []


def test_handshakes_go_out_together_and_payloads_one_at_a_time(monkeypatch):
    # A pass over peers that drop connections must cost one timeout, not one per peer (serve.yml's probe took
    # 8 s for a 3 s timeout); payloads sent together would share the link and misread each one's throughput.
    targets = [("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)]
    together = threading.Barrier(len(targets), timeout=5)
    inside, most = [0], [0]
    lock = threading.Lock()

    def fake_measure(target, payload_bytes, timeout_s):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            if not payload_bytes:
                together.wait()  # breaks (and fails the test) unless every handshake is under way at once
            else:
                time.sleep(0.05)
            return 1.0, None, ""
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ring_probe, "measure", fake_measure)
    assert [target for target, dummy in ring_probe.measure_each(targets, 0, 1.0)] == targets
    assert most[0] == len(targets)
    most[0] = 0
    assert [result for dummy, result in ring_probe.measure_each(targets, 1024, 1.0)] == [(1.0, None, "")] * 3
    assert most[0] == 1
