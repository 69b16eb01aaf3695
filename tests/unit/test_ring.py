import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.ring import (GIB, gpu_layers, layer_window,
                                                                                rank_ports, ring_neighbours,
                                                                                window_problems)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_closes_on_rank_0(world):
    addresses = ["10.0.0.%d" % (10 + rank) for rank in range(world)]
    ring = ring_neighbours(addresses)
    assert [entry["rank"] for entry in ring] == list(range(world))
    assert all(entry["master"] == "10.0.0.10" and entry["world"] == world for entry in ring)
    assert [entry["next"] for entry in ring] == addresses[1:] + addresses[:1]


def test_ports():
    assert rank_ports(0, 9000, 10000) == {"data_port": 9000, "signal_port": 10000}
    assert rank_ports(3, 19000, 20000) == {"data_port": 19003, "signal_port": 20003}


@pytest.mark.parametrize("n_layer, usable, expected", [
    (80, [24], [80]),                              # 1 rank: everything
    (80, [24, 24], [40, 40]),                      # equal nodes: equal halves
    (8, [1, 1, 1], [3, 3, 2]),                     # 8 over 3 equal: the tie goes to the lower ranks
    (80, [24, 8], [60, 20]),                       # 3:1 memory -> 3:1 layers
    (64, [10, 20, 30, 40], [7, 13, 19, 25]),       # 4 ranks, largest remainder
    (4, [1000, 1, 1, 1], [1, 1, 1, 1]),            # every rank keeps one layer
])
def test_layer_window(n_layer, usable, expected):
    window = layer_window(n_layer, [value * GIB for value in usable])
    assert window == expected and sum(window) == n_layer


def test_layer_window_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="3 layers cannot give each of 4 ranks one"):
        layer_window(3, [1, 1, 1, 1])
    with pytest.raises(ValueError, match="usable memory > 0"):
        layer_window(8, [GIB, 0])


def test_gpu_layers_vram_first():
    assert gpu_layers([60, 20], [22 * GIB, 0], GIB // 2) == [44, 0]
    assert gpu_layers([10], [100 * GIB], GIB) == [10]


def plan_problems(n_layer, layer_bytes, usable, hosts):
    return window_problems(layer_window(n_layer, usable), layer_bytes, usable, hosts)


def test_plan_problems_name_the_rank_and_numbers():
    assert plan_problems(80, GIB // 2, [48 * GIB, 48 * GIB], ["a", "b"]) == []
    # 78 spare layers in 70:10 -> 68.25 and 9.75, the remainder goes to rank 1: [69, 11].
    assert plan_problems(80, GIB, [70 * GIB, 10 * GIB], ["a", "b"]) == [
        "rank 1 (b): 11 layers need 11.00 GiB, 10.00 GiB usable; add nodes or pick a smaller model"]
