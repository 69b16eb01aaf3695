import os

import pytest
import yaml

from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import (
    catalog_problems_detailed, digest_conflicts, disk_problem, fact_entries, lock_updates, merged_catalog, models_files,
    models_selection)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHA_A = "a" * 64


def entry(**changes):
    base = {"hub_repo": "org/repo", "revision": "main", "n_layer": 8,
            "files": [{"name": "m.gguf", "size": 100, "sha256": None}]}
    base.update(changes)
    return base


def test_the_shipped_catalogs_are_valid():
    with open(os.path.join(REPO, "inventory", "group_vars", "all", "models.yml")) as handle:
        shipped = yaml.safe_load(handle)
    with open(os.path.join(REPO, "inventory", "group_vars", "sandbox.yml")) as handle:
        sandbox = yaml.safe_load(handle)
    catalog = merged_catalog(shipped["models_catalog"], sandbox["models_extra_catalog"])
    assert sorted(catalog) == ["32b", "70b", "8b", "large", "tiny", "tiny-split"]
    assert catalog_problems_detailed(catalog) == []
    assert sandbox["models_enabled"] == ["tiny"]


@pytest.mark.parametrize("changes, fragment", [
    ({"hub_repo": "no-slash"}, "models_catalog['m'].hub_repo 'no-slash' is not an 'owner/name'"),
    ({"n_layer": 0}, "models_catalog['m'].n_layer '0' must be the model's layer count"),
    ({"files": []}, "models_catalog['m'].files must list the GGUF file(s)"),
    ({"files": [{"name": "m.bin", "size": 1}]}, "models_catalog['m'].files[0] needs a name ending in .gguf"),
    ({"files": [{"name": "m.gguf", "size": "big"}]}, "(m.gguf): size 'big' must be the file's size in bytes"),
    ({"files": [{"name": "m.gguf", "size": 1, "sha256": "abc"}]}, "(m.gguf): sha256 'abc' is not 64 hex digits"),
    ({"files": [{"name": "m-00001-of-00003.gguf", "size": 1}, {"name": "m-00003-of-00003.gguf", "size": 1}]},
     "must list every part 00001..N of the split GGUF"),
    ({"files": [{"name": "m-00001-of-00002.gguf", "size": 1}, {"name": "x.gguf", "size": 1}]},
     "mixes split parts"),
])
def test_catalog_problems_name_the_entry_and_the_fix(changes, fragment):
    problems = catalog_problems_detailed({"m": entry(**changes)})
    assert len(problems) == 1 and fragment in problems[0], problems


@pytest.mark.parametrize("changes, fragment", [
    # Issue 12: an empty revision got past the preflight, and so did file names with ../ .
    ({"revision": ""}, "models_catalog['m'].revision is empty; set it to a branch, tag or commit"),
    ({"revision": "  "}, "models_catalog['m'].revision is empty"),
    ({"revision": None}, "models_catalog['m'].revision is empty"),
    ({"revision": "a b"}, "models_catalog['m'].revision 'a b' is not a branch, tag or commit name"),
    ({"revision": "../main"}, "models_catalog['m'].revision '../main' is not a branch, tag or commit name"),
    ({"revision": "main\n"}, "models_catalog['m'].revision 'main\\n' is not a branch"),
    ({"revision": 1234567}, "models_catalog['m'].revision '1234567' is not a string; set it to a branch, tag or "
                            "commit of the hub repository, quoted (revision: '1234567')"),
    ({"files": [{"name": "../x.gguf", "size": 1}]},
     "models_catalog['m'].files[0] name '../x.gguf' is not a plain file name"),
    ({"files": [{"name": "sub/x.gguf", "size": 1}]}, "files[0] name 'sub/x.gguf' is not a plain file name"),
    ({"files": [{"name": "a b.gguf", "size": 1}]}, "files[0] name 'a b.gguf' is not a plain file name"),
    ({"files": [{"name": "x\n.gguf", "size": 1}]}, "files[0] name 'x\\n.gguf' is not a plain file name"),
    ({"files": [{"name": "..gguf", "size": 1}]}, "files[0] name '..gguf' is not a plain file name"),
    ({"files": [{"name": "m.gguf", "size": 1, "sha256": SHA_A + "\n"}]}, "is not 64 hex digits"),
])
def test_names_that_reach_paths_and_urls_are_checked(changes, fragment):
    problems = catalog_problems_detailed({"m": entry(**changes)})
    assert len(problems) == 1 and fragment in problems[0], problems
    assert "\n" not in problems[0]


@pytest.mark.parametrize("key", ["a b", "m\nExecStartPre=/bin/true", "../x", "x/y", "-x", "a..b", "", 70])
def test_model_keys_must_name_files_and_units(key):
    """Issue 12: a key with a newline broke out of the launcher's comment, one with a space split ExecStart."""
    [problem] = catalog_problems_detailed({key: entry()})
    assert problem.startswith("models_catalog[%s]: the key " % (repr(key) if isinstance(key, str) else "'70'"))
    assert "\n" not in problem and ("rename the entry" in problem or "quote it" in problem)


def test_good_names_and_revisions_pass():
    for revision in ("main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567"):
        assert catalog_problems_detailed({"Qwen2.5-7B_q4": entry(revision=revision)}) == []
    files = [{"name": "Meta-Llama-3-8B-Instruct-Q4_K_M.gguf", "size": 1}]
    assert catalog_problems_detailed({"8b": entry(files=files)}) == []


def test_catalog_problems_name_the_host_and_the_extra_catalog():
    catalog = {"m": entry(revision=""), "x": entry(files=[{"name": "../x.gguf", "size": 1}])}
    problems = catalog_problems_detailed(catalog, {"x": {}}, "n0")
    assert problems[0].startswith("host n0: models_catalog['m'].revision is empty")
    assert problems[1].startswith("host n0: models_extra_catalog['x'].files[0] name '../x.gguf'")


def test_split_parts_in_order_are_fine():
    files = [{"name": "m-00001-of-00002.gguf", "size": 5}, {"name": "m-00002-of-00002.gguf", "size": 5}]
    assert catalog_problems_detailed({"m": entry(files=files)}) == []


def test_selection():
    catalog = {"8b": {}, "70b": {}, "tiny": {}}
    assert models_selection(None, ["8b", "70b"], catalog) == ["8b", "70b"]
    assert models_selection("70b", ["8b"], catalog) == ["70b"]
    assert models_selection("tiny,8b,tiny", [], catalog) == ["tiny", "8b"]
    with pytest.raises(ValueError, match="unknown model key.*13b.*known keys: 70b, 8b, tiny"):
        models_selection(["13b"], [], catalog)


def test_files_take_the_catalog_pin_then_the_lock():
    catalog = {"m": entry(files=[{"name": "a.gguf", "size": 10, "sha256": SHA_A.upper()},
                                 {"name": "b.gguf", "size": 20, "sha256": None},
                                 {"name": "c.gguf", "size": 30}])}
    lock = {"org/repo@main/b.gguf": "b" * 64}
    records = models_files(["m"], catalog, lock, "http://hub:8088/")
    assert [(r["name"], r["sha256"], r["digest_source"]) for r in records] == [
        ("a.gguf", SHA_A, "catalog"), ("b.gguf", "b" * 64, "lock"), ("c.gguf", "", "first download")]
    assert records[0]["url"] == "http://hub:8088/org/repo/resolve/main/a.gguf"


def test_lock_records_first_digests_only():
    catalog = {"m": entry(files=[{"name": "a.gguf", "size": 1, "sha256": SHA_A}, {"name": "c.gguf", "size": 1}])}
    records = models_files(["m"], catalog, {}, "http://hub")
    lock = lock_updates({"other@main/x.gguf": "e" * 64}, records, {"a.gguf": SHA_A, "c.gguf": "c" * 64})
    assert lock == {"other@main/x.gguf": "e" * 64,
                    "org/repo@main/c.gguf": {"sha256": "c" * 64, "commit": None, "size": 1}}
    records = models_files(["m"], catalog, lock, "http://hub")
    assert lock_updates(lock, records, {"c.gguf": "d" * 64}) == lock


def test_digest_conflicts_name_the_nodes():
    assert digest_conflicts({"n0": {"a": SHA_A}, "n1": {"a": SHA_A}}) == []
    [problem] = digest_conflicts({"n0": {"a": SHA_A}, "n1": {"a": "b" * 64}, "n2": {"a": SHA_A}})
    assert problem.startswith("a differs between nodes: aaaaaaaaaaaa on n0, n2; bbbbbbbbbbbb on n1")


def test_disk_problem_gives_the_numbers():
    gib = 1024 ** 3
    files = [{"name": "a", "size": 40 * gib}, {"name": "b", "size": 2 * gib}]
    assert disk_problem("n0", "/opt/models", 50 * gib, files, {}, 5) is None
    assert disk_problem("n0", "/opt/models", 1, files, {"a": 40 * gib, "b": 2 * gib}, 5) is None
    problem = disk_problem("n1", "/opt/models", 30 * gib, files, {"a": 10 * gib}, 5)
    assert problem.startswith("n1: /opt/models has 30.00 GiB free; the selected weights need 32.00 GiB more "
                              "plus a 5.00 GiB margin (models_disk_margin_gib), 7.00 GiB short.")


def test_fact_entries_keep_earlier_models():
    records = [{"model": "tiny", "name": "t.gguf"}, {"model": "tiny", "name": "u.gguf"}]
    fact = fact_entries({"old.gguf": {"model": "8b"}}, records, {"t.gguf": SHA_A}, "/opt/models/")
    assert fact == {"old.gguf": {"model": "8b"},
                    "t.gguf": {"model": "tiny", "sha256": SHA_A, "path": "/opt/models/t.gguf"}}
