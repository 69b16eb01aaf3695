#!/usr/bin/env python3
"""Stops a rank that has stalled: no output and no traffic for STALL_S seconds.

    python3 rank_watchdog.py STATE_DIR PID START_TICKS STALL_S POLL_S

Started by the rank's launcher script (roles/launch/templates/rank.sh.j2, `run`) beside the rank's `timeout`, PID, whose
start time (field 22 of /proc/PID/stat) is START_TICKS. prima.cpp and llama.cpp have no timeouts of their own: a
cut network, a stuck GPU or a SIGSTOP hangs a rank, and its ring, until launch_timeout_s. A rank is busy while
any of these moves between two polls:

- the sizes of STATE_DIR/stdout and STATE_DIR/stderr (llama.cpp prints a dot per 1 % of its weights loaded);
- rchar, wchar, read_bytes, write_bytes of /proc/P/io, summed over PID and its descendants (every thread is in
  its process's counters): file and pipe traffic, and weights paged in from an mmap (prima.cpp at the pinned
  commit loads lazily and prints nothing while it does);
- the bytes acknowledged and received of every TCP socket the processes hold, from the kernel's sock_diag
  netlink (tcp_info): send(2) and recv(2), which ZeroMQ, ggml's RPC and llama-server use, count in no
  /proc/P/io counter, so a worker busy with the ring would look silent there.

When none moved for STALL_S seconds it writes STATE_DIR/stalled (the seconds, then what it saw) and SIGKILLs the
rank's process group: SIGKILL ends a stopped process too, SIGTERM waits for a SIGCONT. rank.sh then records
STALL_EXIT. It ends by itself once the rank or the launcher is gone. Python 3.8 and the standard library only.
"""

import os
import signal
import socket
import struct
import sys
import time
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

# The exit status rank.sh records for a rank stopped here: clear of 0/1, sysexits (64-78), Python's 120, xargs'
# 123, timeout's 124-127, a signal's 128+N (134, 137, 139, 141, 143) and systemd's 200+. The same number and
# words are in plugin_utils/launch/exit_status.py and the serve supervisor (a test holds them equal).
STALL_EXIT = 119
STALL_WORDS = "stalled: no output and no traffic for %s"
IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")
STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible wait (a driver or the disk)", "T": "stopped",
          "t": "stopped by a tracer", "Z": "a zombie"}

# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one dump of every TCP socket of the network namespace.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_INFO = 2
NLMSG_HEADER = struct.Struct("=IHHII")
DIAG_REQUEST = struct.Struct("=BBBBI48x")  # family, protocol, extensions, pad, states; a zero inet_diag_sockid
DIAG_INODE_OFFSET = 68  # in inet_diag_msg: family, state, timer, retrans, the 48-byte sockid, expires, rqueue,
#                          wqueue, uid, then the inode
TCP_INFO_BYTES = struct.Struct("=QQ")  # tcpi_bytes_acked, tcpi_bytes_received
TCP_INFO_BYTES_OFFSET = 120


def stall_words(seconds: int) -> str:
    return STALL_WORDS % ("%d s" % seconds)


class Process(NamedTuple):
    pid: int
    ppid: int
    state: str
    start: str  # clock ticks since boot: with the pid, names the process (pids are reused)
    name: str
    cpu: int  # user and system clock ticks


def parse_stat(pid: int, text: str) -> Optional[Process]:
    """/proc/PID/stat: the name (field 2) may hold spaces and parentheses, so fields count from its last ')'."""
    head, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    return Process(pid, int(fields[1]), fields[0], fields[19], head.partition("(")[2],
                   int(fields[11]) + int(fields[12]))


def parse_io(text: str) -> Tuple[int, ...]:
    values = {}  # type: Dict[str, int]
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if colon and value.strip().isdigit():
            values[name.strip()] = int(value)
    return tuple(values.get(name, 0) for name in IO_FIELDS)


def descendants(root: int, processes: Iterable[Process]) -> List[int]:
    """root and every process under it (a prima.cpp head runs fio while it profiles)."""
    children = {}  # type: Dict[int, List[int]]
    for process in processes:
        children.setdefault(process.ppid, []).append(process.pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.append(pid)
            todo += children.get(pid, [])
    return found


def parse_diag(data: bytes) -> Tuple[bool, Dict[int, int]]:
    """(the dump is done, bytes acked + received by socket inode) from one netlink read."""
    found = {}  # type: Dict[int, int]
    offset = 0
    while offset + NLMSG_HEADER.size <= len(data):
        length, kind = NLMSG_HEADER.unpack_from(data, offset)[:2]
        if length < NLMSG_HEADER.size:
            break
        if kind == NLMSG_DONE:
            return True, found
        if kind == NLMSG_ERROR:
            raise OSError("sock_diag answered error %d" % -struct.unpack_from("=i", data, offset + 16)[0])
        body = data[offset + NLMSG_HEADER.size:offset + length]
        if len(body) >= DIAG_INODE_OFFSET + 4:
            inode = struct.unpack_from("=I", body, DIAG_INODE_OFFSET)[0]
            attribute = DIAG_INODE_OFFSET + 4
            while attribute + 4 <= len(body):
                size, kind = struct.unpack_from("=HH", body, attribute)
                if size < 4:
                    break
                end = TCP_INFO_BYTES_OFFSET + TCP_INFO_BYTES.size
                if kind == INET_DIAG_INFO and size - 4 >= end:
                    found[inode] = sum(TCP_INFO_BYTES.unpack_from(body, attribute + 4 + TCP_INFO_BYTES_OFFSET))
                attribute += (size + 3) & ~3
        offset += (length + 3) & ~3
    return False, found


def tcp_bytes() -> Dict[int, int]:
    """Bytes acked + received of every TCP socket (IPv4 and IPv6) in this network namespace, by inode."""
    found = {}  # type: Dict[int, int]
    for family in (socket.AF_INET, socket.AF_INET6):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(5)
            request = DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, 0xFFFFFFFF)
            diag.sendto(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP,
                                          1, 0) + request, (0, 0))
            done = False
            while not done:
                done, more = parse_diag(diag.recv(1 << 20))
                found.update(more)
    return found


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def processes() -> List[Process]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                process = parse_stat(int(entry), read("/proc/%s/stat" % entry))
            except (OSError, ValueError):
                continue  # gone meanwhile
            if process:
                found.append(process)
    return found


def socket_inodes(pid: int) -> Set[int]:
    inodes = set()
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[8:-1]))
    return inodes


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


class Sample(NamedTuple):
    outputs: Tuple[int, int]
    io: Tuple[int, ...]
    sockets: Dict[int, int]  # bytes by inode, of the rank's own sockets
    cpu: Optional[int]  # only without socket counters: send(2) and recv(2) then show as the time they take


def moved(before: Sample, after: Sample) -> bool:
    """Anything printed or read or written, or any socket of the rank's that sent or received a byte. A socket
    that closed is no traffic: a ZeroMQ peer redialling a dead rank opens and drops empty sockets forever."""
    if before.outputs != after.outputs or before.io != after.io or before.cpu != after.cpu:
        return True
    return any(sent > before.sockets.get(inode, 0) for inode, sent in after.sockets.items())


def sample(state_dir: str, tree: Sequence[int], diag: Optional[Dict[int, int]], cpu: Optional[int]) -> Sample:
    totals = [0] * len(IO_FIELDS)
    sockets = {}  # type: Dict[int, int]
    for pid in tree:
        try:
            counters = parse_io(read("/proc/%d/io" % pid))
        except OSError:
            continue
        totals = [total + value for total, value in zip(totals, counters)]
        if diag is not None:
            sockets.update((inode, diag[inode]) for inode in socket_inodes(pid) if inode in diag)
    return Sample((file_size(os.path.join(state_dir, "stdout")), file_size(os.path.join(state_dir, "stderr"))),
                  tuple(totals), sockets, cpu)


def seen(tree: Sequence[int], table: Dict[int, Process]) -> str:
    return "; ".join("%s (pid %d) %s" % (table[pid].name, pid, STATES.get(table[pid].state, table[pid].state))
                     for pid in tree if pid in table)


def write_marker(state_dir: str, stall_s: int, detail: str) -> None:
    """Written whole before the kill: rank.sh reads it as soon as its `wait` returns."""
    path = os.path.join(state_dir, "stalled")
    with open(path + ".tmp", "w") as handle:
        handle.write("%d\n%s; %s\n" % (stall_s, stall_words(stall_s), detail))
    os.replace(path + ".tmp", path)


def kill(root: int, tree: Sequence[int]) -> None:
    """timeout(1) leads its own process group, the rank in it; a descendant that left the group is named too."""
    try:
        if os.getpgid(root) == root:
            os.killpg(root, signal.SIGKILL)
    except OSError:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def watch(state_dir: str, root: int, start: str, stall_s: int, poll_s: float) -> int:
    launcher = os.getppid()
    diag_ok = True  # sock_diag needs the kernel's tcp_diag; without it, CPU time stands in for the sockets
    last = None  # type: Optional[Sample]
    quiet_since = time.monotonic()
    while True:
        table = {process.pid: process for process in processes()}
        rank = table.get(root)
        if rank is None or rank.start != start or rank.state in ("Z", "X") or os.getppid() != launcher:
            return 0
        tree = descendants(root, table.values())
        diag = None  # type: Optional[Dict[int, int]]
        if diag_ok:
            try:
                diag = tcp_bytes()
            except (OSError, ValueError, struct.error) as error:
                diag_ok = False
                print("rank_watchdog: cannot read TCP socket counters (%s); CPU time counts as traffic instead"
                      % error, file=sys.stderr, flush=True)
        cpu = None if diag_ok else sum(table[pid].cpu for pid in tree if pid in table)
        now = sample(state_dir, tree, diag, cpu)
        if last is None or moved(last, now):
            quiet_since = time.monotonic()
        last = now
        quiet_s = time.monotonic() - quiet_since
        if quiet_s >= stall_s:
            write_marker(state_dir, stall_s, "quiet for %.0f s; %s" % (quiet_s, seen(tree, table)))
            kill(root, tree)
            return 0
        time.sleep(poll_s)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 6 or not all(word.isdigit() for word in argv[2:6]) or int(argv[4]) < 1 or int(argv[5]) < 1:
        print("usage: rank_watchdog.py STATE_DIR PID START_TICKS STALL_S POLL_S (whole numbers >= 1)",
              file=sys.stderr)
        return 2
    return watch(argv[1], int(argv[2]), argv[3], int(argv[4]), float(argv[5]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
