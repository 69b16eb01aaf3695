"""The rental's decisions (plugins/plugin_utils/glows/rental.py): keys, plan, ports, progress, cost."""

import json

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.glows import rental as glows_rental

REQUEST = {"count": 3, "gpu_name": "NVIDIA GeForce RTX 4090", "region_name": "TW-03", "image_id": "img-87p9kq26",
           "snapshot_id": "", "instance_category": "container", "remark": "prima-cluster"}


def instance(key, status="Running", gpu="NVIDIA GeForce RTX 4090", price=65, created=1000, url="ssh://a.example:1"):
    return {"instanceID": "ins-" + key[-4:], "metaKey": key, "status": status, "priceCent": price,
            "hardware": {"gpuName": gpu}, "createTime": {"seconds": created},
            "sshCred": {"user": "root", "password": "secret-pw"},
            "accesses": [{"protocol": "ssh", "listenPort": 22, "url": url}] if url is not None else []}


@pytest.mark.parametrize("prefix", ["prima-x7k2", "a", "lab-1-b"])
def test_good_prefixes(prefix):
    assert glows_rental.prefix_problems(prefix) == []


@pytest.mark.parametrize("prefix", ["", None, "Prima", "prima-", "-prima", "prima--x", "prima x", "prima;rm",
                                    "prima\nx", "a" * 49, "prima_x", 7])
def test_bad_prefixes_are_refused_saying_why(prefix):
    problems = glows_rental.prefix_problems(prefix)
    assert len(problems) == 1 and "prefix" in problems[0]


def test_new_prefix_is_a_good_prefix():
    assert glows_rental.new_prefix("AB12;x\n") == "prima-ab12x"
    assert glows_rental.prefix_problems(glows_rental.new_prefix("deadbeef")) == []


def test_only_exact_keys_of_the_prefix_are_owned():
    others = [instance(key) for key in ("prima-a-0", "prima-a-1", "prima-a-10", "prima-ab-0", "prima-a-0x",
                                        "prima-a-01", "prima-a", "xprima-a-2", "prima-a-1-2")]
    others.append({"instanceID": "ins-nokey"})
    assert [i["metaKey"] for i in glows_rental.owned(others, "prima-a")] == ["prima-a-0", "prima-a-1", "prima-a-10"]


def test_plan_creates_only_what_is_missing():
    decided = glows_rental.plan([instance("prima-a-1"), instance("other-0")], "prima-a", REQUEST)
    assert decided["create"] == ["prima-a-0", "prima-a-2"] and decided["problems"] == []
    assert [i["metaKey"] for i in decided["existing"]] == ["prima-a-1"]
    assert "secret-pw" not in json.dumps(decided)


def test_plan_refuses_more_instances_than_count_and_another_gpu():
    decided = glows_rental.plan([instance("prima-a-0"), instance("prima-a-3"),
                                 instance("prima-a-1", gpu="NVIDIA L40S")], "prima-a", REQUEST)
    text = "; ".join(decided["problems"])
    assert "more than count=3 (prima-a-3)" in text and "-e count=4" in text and "glows-release.yml" in text
    assert "prima-a-1" in text and "NVIDIA L40S" in text


@pytest.mark.parametrize("change, needle", [({"count": 0}, "count"), ({"count": True}, "count"),
                                            ({"count": 65}, "count"), ({"gpu_name": ""}, "-e gpu"),
                                            ({"gpu_name": "a\nb"}, "-e gpu"), ({"region_name": " "}, "-e region"),
                                            ({"snapshot_id": "snap-1"}, "exactly one"),
                                            ({"image_id": ""}, "exactly one"),
                                            ({"instance_category": "pod"}, "container or vm")])
def test_request_problems_name_the_variable(change, needle):
    problems = glows_rental.request_problems(dict(REQUEST, **change))
    assert problems and needle in "; ".join(problems)


def test_create_body_follows_the_documented_fields():
    body = glows_rental.create_body("prima-a-0", REQUEST, [{"port": 22, "protocol": 1}])
    assert body == {"gpu_name": "NVIDIA GeForce RTX 4090", "custom_meta_key": "prima-a-0", "region_name": "TW-03",
                    "instance_category": "container", "ports": '[{"port":22,"protocol":1}]',
                    "from_image_id": "img-87p9kq26", "remark": "prima-cluster"}
    snap = glows_rental.create_body("prima-a-0", dict(REQUEST, image_id="", snapshot_id="snap-x"), [])
    assert snap["from_snap_id"] == "snap-x" and "from_image_id" not in snap


def test_ports_ssh_alone_unless_direct():
    bases = {"data": 9000, "signal": 10000, "rpc": 50052, "fanout": 18090}
    assert glows_rental.transport_ports("auto", 3, bases) == [{"port": 22, "protocol": 1}]
    assert glows_rental.transport_ports("ssh", 3, bases) == [{"port": 22, "protocol": 1}]
    direct = glows_rental.transport_ports("direct", 3, bases)
    assert [p["port"] for p in direct] == [22, 9000, 9001, 9002, 10000, 10001, 10002, 18090, 50052, 50053]


def test_progress_waits_for_ssh_access_and_notices_lost_instances():
    keys = ["prima-a-0", "prima-a-1", "prima-a-2"]
    state = glows_rental.progress([instance("prima-a-0"), instance("prima-a-1", status="SchedQueued", url=""),
                                   instance("prima-a-2", url=None)], keys, 12.4)
    assert not state["ready"] and state["lost"] == []
    assert state["line"] == ("1/3 Running after 12 s: prima-a-0 Running, prima-a-1 SchedQueued, "
                             "prima-a-2 Running, no SSH access yet")
    gone = glows_rental.progress([instance("prima-a-0")], keys[:2], 1)
    assert gone["lost"] == ["prima-a-1"] and not gone["ready"]
    assert glows_rental.progress([instance(key) for key in keys], keys, 3)["ready"]


def test_cost():
    three = [instance("prima-a-%d" % i, price=65, created=0) for i in range(3)]
    assert glows_rental.hourly_cents(three) == 195
    assert glows_rental.hourly_cents(three + [instance("prima-a-3", price=0)]) is None
    assert glows_rental.hourly_cents([instance("prima-a-0", price=True)]) is None
    assert glows_rental.spent_text(three, now=1800) == "about $0.97 (3 instances since their creation)"
    unknown = glows_rental.spent_text([dict(instance("prima-a-0"), createTime=None)], now=10)
    assert unknown.startswith("unknown") and "prima-a-0" in unknown


def test_rental_record_holds_no_password():
    record = glows_rental.rental_record("prima-a", "http://x", REQUEST, [instance("prima-a-0")], now=5)
    assert record["prefix"] == "prima-a" and record["instances"] == [{"meta_key": "prima-a-0",
                                                                      "instance_id": "ins--a-0"}]
    assert "secret-pw" not in json.dumps(record)
    assert "secret-pw" not in json.dumps(glows_rental.public_view(instance("prima-a-0")))


def test_a_status_that_says_the_instance_will_not_come_fails_at_once():
    keys = ["prima-a-0", "prima-a-1"]
    state = glows_rental.progress([instance("prima-a-0", status="Failed"), instance("prima-a-1", status="Creating",
                                                                                    url="")], keys, 5)
    assert state["failed"] == ["prima-a-0"] and not state["ready"]
    assert "prima-a-1 Creating" in state["line"]


def test_answers_of_the_wrong_shape_are_no_crash():
    odd = dict(instance("prima-a-0"), accesses=5, hardware="x", createTime="x")
    assert not glows_rental.has_ssh_url(odd)
    assert glows_rental.plan([odd], "prima-a", REQUEST)["problems"] == []
    assert glows_rental.spent_text([odd], now=10).startswith("unknown")
    assert not glows_rental.progress([odd], ["prima-a-0"], 1)["ready"]


def test_a_listed_instance_is_cancelled_by_id_only_when_its_query_carries_the_key():
    listed = {"metaKey": "prima-victim-0", "instanceID": "ins-production-db"}
    assert glows_rental.cancel_problem(listed, {"metaKey": "prima-victim-0", "instanceID": "ins-production-db"},
                                       "prima-victim") is None
    problem = glows_rental.cancel_problem(listed, {"metaKey": "production-db-0", "instanceID": "ins-production-db"},
                                          "prima-victim")
    assert problem is not None and "prima-victim-0" in problem and "ins-production-db" in problem
    assert "production-db-0" in problem and "\n" not in problem
    assert "no metaKey" in glows_rental.cancel_problem(listed, {"instanceID": "ins-production-db"}, "prima-victim")
    assert glows_rental.cancel_problem({"metaKey": "other-0", "instanceID": "ins-1"}, {"metaKey": "other-0"},
                                       "prima-victim") is not None
