"""ggml-rpc-server -c (launch_rpc_cache): the workers' argv, and the launcher that keeps their cache whole and
within the model's size (roles/launch/templates/rank.sh.j2, run in bash)."""

import os
import time

import pytest

from test_launch import TINY, launch_plans, nodes, options, render, sh

HASH_A, HASH_B, HASH_C = "0123456789abcdef", "fedcba9876543210", "00000000000000aa"


def rpc_plan(catalog_entry=TINY, **overrides):
    return launch_plans(nodes(3), ["llama_rpc"], ["tiny"], {"tiny": catalog_entry}, options(**overrides))["llama_rpc-tiny"]


def test_every_worker_caches_within_the_models_size_and_the_head_does_not():
    plan = rpc_plan()
    assert "rpc_cache" not in plan["units"]["n0"]  # the head's -c is its context size
    for host in ("n1", "n2"):
        unit = plan["units"][host]
        assert unit["argv"][unit["argv"].index("-t") + 2] == "-c"
        # ggml-rpc-server caches in $LLAMA_CACHE/rpc: the launcher looks after that directory.
        assert unit["rpc_cache"] == {"dir": unit["env"]["LLAMA_CACHE"] + "/rpc", "max_bytes": 8000}


@pytest.mark.parametrize("entry, overrides", [
    (TINY, {"rpc_cache": "false"}),
    ({"n_layer": 8, "files": [{"name": "tiny.gguf", "size": None}]}, {}),
], ids=["turned-off", "no-size-no-bound"])
def test_no_cache_when_turned_off_or_without_a_bound(entry, overrides):
    plan = rpc_plan(entry, **overrides)
    for host in ("n1", "n2"):
        assert "-c" not in plan["units"][host]["argv"] and "rpc_cache" not in plan["units"][host]


def worker(tmp_path, writes=(), max_bytes=1000):
    """A launcher for a worker whose rank writes `writes` (hash, bytes) into its cache, as ggml-rpc-server -c does;
    its state directory has a space in it."""
    state = tmp_path / "state dir"
    cache = state / "cache" / "rpc"
    command = "; ".join("printf %%s %s >\"$LLAMA_CACHE/rpc/%s\"" % ("x" * size, name) for name, size in writes)
    unit = {"name": "w", "runtime": "llama_rpc", "role": "worker", "rank": 1, "world": 2, "model": "tiny",
            "argv": ["sh", "-c", command or "true"], "env": {"LLAMA_CACHE": str(state / "cache")}, "listen": [],
            "state_dir": str(state), "stall_s": 0, "rpc_cache": {"dir": str(cache), "max_bytes": max_bytes}}
    script = tmp_path / "w.sh"
    script.write_text(render("rank.sh.j2", unit, launch_script=str(script)))
    script.chmod(0o755)
    return str(script), cache


def cached(cache):
    return sorted(name for name in os.listdir(str(cache)) if not name.startswith("."))


def test_what_an_unconfirmed_run_wrote_is_deleted_before_the_next_run(tmp_path):
    script, cache = worker(tmp_path, [(HASH_A, 10), (HASH_B, 20)])
    assert sh(script, "run").returncode == 0 and cached(cache) == [HASH_A, HASH_B]
    # No `finish cache-confirmed`: the head did not load, a file may be cut. The next run starts without them.
    assert sh(script, "finish").returncode == 0
    empty, _ = worker(tmp_path)
    assert sh(empty, "run").returncode == 0 and cached(cache) == []


def test_a_confirmed_runs_files_are_kept_by_the_runs_after_it(tmp_path):
    script, cache = worker(tmp_path, [(HASH_A, 10), (HASH_B, 20)])
    assert sh(script, "run").returncode == 0
    assert sh(script, "finish", "cache-confirmed").returncode == 0
    empty, _ = worker(tmp_path)
    for _ in range(2):
        assert sh(empty, "run").returncode == 0 and cached(cache) == [HASH_A, HASH_B]
        assert sh(empty, "finish").returncode == 0
    # A server that answers vouches for its workers' cache with confirm-cache (roles/serve/tasks/up.yml).
    writer, _ = worker(tmp_path, [(HASH_C, 5)])
    assert sh(writer, "run").returncode == 0 and sh(writer, "confirm-cache").returncode == 0
    assert sh(empty, "run").returncode == 0 and cached(cache) == [HASH_C, HASH_A, HASH_B]


def test_the_oldest_files_beyond_the_models_size_go_first_and_nothing_else_is_touched(tmp_path):
    script, cache = worker(tmp_path, max_bytes=100)
    cache.mkdir(parents=True)
    now = time.time()
    for age, name in ((30, HASH_A), (20, HASH_B), (10, HASH_C)):
        (cache / name).write_bytes(b"x" * 45)
        os.utime(str(cache / name), (now - age, now - age))
    (cache / "notes.txt").write_bytes(b"x" * 500)  # not a cached tensor's name: left alone
    assert sh(script, "run").returncode == 0
    assert cached(cache) == [HASH_C, HASH_B, "notes.txt"]


def test_finish_refuses_a_word_it_does_not_know(tmp_path):
    script, _ = worker(tmp_path)
    done = sh(script, "finish", "cache-confirmed; rm -rf /")
    assert done.returncode == 2 and "usage" in done.stderr


def test_a_run_that_began_short_of_disk_is_never_confirmed(tmp_path):
    # ggml-rpc-server does not check its writes: on a full disk a file ends short and the head still passes.
    # A bound larger than any disk stands in for a disk without room for the rest of the cache.
    script, cache = worker(tmp_path, [(HASH_A, 10)], max_bytes=2 ** 62)
    assert sh(script, "run").returncode == 0
    assert (cache / ".unconfirmed").read_text().splitlines()[0] == "SHORT_OF_DISK"
    assert sh(script, "finish", "cache-confirmed").returncode == 0
    assert sh(script, "confirm-cache").returncode == 0
    empty, _ = worker(tmp_path, max_bytes=1000)
    assert sh(empty, "run").returncode == 0 and cached(cache) == []


def test_a_cache_that_cannot_be_made_ready_fails_the_start_saying_why(tmp_path):
    script, cache = worker(tmp_path)
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the cache's directory goes")
    assert sh(script, "run").returncode == 1
    state = cache.parent.parent
    assert (state / "exit").read_text() == "1\n"
    assert "could not make the tensor cache %s ready" % cache in (state / "stderr").read_text()
    listening = sh(script, "listening", "5")
    assert listening.returncode == 1 and "exited with status 1 before listening" in listening.stderr
