"""The prima.cpp ring and our deterministic layer-window planner (pure functions).

prima.cpp's own allocator (HiGHS) is not reproducible from run to run and asserts on
container-like hosts, so by default the benchmark gives rank 0 an explicit `-lw`
computed here: layers in proportion to each rank's usable memory, VRAM first.
"""

from typing import Dict, List, Sequence

GIB = 1024 ** 3


def ring_neighbours(addresses: Sequence[str]) -> List[Dict[str, object]]:
    """For ranks 0..W-1 at these cluster addresses: rank, world, master (rank 0), next rank's address."""
    if not addresses:
        raise ValueError("a ring needs at least one rank")
    world = len(addresses)
    return [{"rank": rank, "world": world, "master": addresses[0], "next": addresses[(rank + 1) % world]}
            for rank in range(world)]


def rank_ports(rank: int, data_port_base: int, signal_port_base: int) -> Dict[str, int]:
    """Rank R listens on data_port_base+R and signal_port_base+R."""
    return {"data_port": data_port_base + rank, "signal_port": signal_port_base + rank}


def layer_window(n_layer: int, usable_bytes: Sequence[int]) -> List[int]:
    """Split n_layer layers across ranks in proportion to usable memory (largest remainder).

    Every rank gets at least one layer (a rank with none would leave the ring: prima.cpp
    makes it exit); ties go to the lower rank, so the same input always gives the same plan.
    """
    ranks = len(usable_bytes)
    if ranks == 0:
        raise ValueError("no ranks to place layers on")
    if n_layer < ranks:
        raise ValueError("%d layers cannot give each of %d ranks one; use fewer ranks (-e world=%d)"
                         % (n_layer, ranks, n_layer))
    if any(value <= 0 for value in usable_bytes):
        raise ValueError("every rank needs usable memory > 0, got %s" % list(usable_bytes))
    spare = n_layer - ranks
    total = float(sum(usable_bytes))
    shares = [spare * value / total for value in usable_bytes]
    window = [1 + int(share) for share in shares]
    left = n_layer - sum(window)
    order = sorted(range(ranks), key=lambda rank: (-(shares[rank] - int(shares[rank])), rank))
    for rank in order[:left]:
        window[rank] += 1
    return window


def gpu_layers(window: Sequence[int], vram_bytes: Sequence[int], layer_bytes: int) -> List[int]:
    """How many of each rank's layers fit in its VRAM (the rest stay in RAM)."""
    if layer_bytes <= 0:
        raise ValueError("layer_bytes must be > 0")
    return [min(layers, int(vram // layer_bytes)) for layers, vram in zip(window, vram_bytes)]


def window_problems(window: Sequence[int], layer_bytes: int, usable_bytes: Sequence[int],
                    hosts: Sequence[str]) -> List[str]:
    """Whether a given layer window fits each rank's usable memory, with the numbers."""
    problems = []
    for rank, (layers, usable) in enumerate(zip(window, usable_bytes)):
        need = layers * layer_bytes
        if need > usable:
            problems.append("rank %d (%s): %d layers need %.2f GiB, %.2f GiB usable; add nodes or pick a smaller "
                            "model" % (rank, hosts[rank], layers, need / GIB, usable / GIB))
    return problems
