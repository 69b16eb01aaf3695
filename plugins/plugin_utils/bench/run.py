"""One benchmark run, judged from what every rank left behind (pure functions, standard library).

The bench role collects, per rank: whether the worker listened, its status before it was
stopped (running, exit status), whether the stop left nothing behind, and its stderr.
`rank_problems` turns that into messages a person can act on; `run_record` into the
figures the report and results.jsonl are made of.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.log import parse_prima_rank, profile_summary
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.perflog import parse_perf
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.exit_status import STALL_EXIT, status_words

# What run_record and the judging read of a plan (as the launch role's launch_plans gives it).
PLAN_KEYS = ("name", "runtime", "model", "world", "hosts", "split")


def exit_meaning(status: Optional[int], stalled_s: Optional[int] = None) -> str:
    """The exit status in words (plugin_utils/launch/exit_status.py); None: the rank still runs."""
    return "still running" if status is None else status_words(status, stalled_s)


def tail(text: str, lines: int) -> str:
    kept = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    return "\n".join(kept[-lines:]) if lines > 0 else ""


def _who(rank: Mapping[str, Any], runtime: str) -> str:
    return "rank %d (%s, %s %s)" % (rank["rank"], rank["host"], runtime, rank["role"])


def _rank_problem(rank: Mapping[str, Any], runtime: str, head_ran: bool) -> Optional[str]:
    status = rank.get("exit")
    who = _who(rank, runtime)
    if rank.get("listen_error"):
        return "%s did not start: %s" % (who, rank["listen_error"])
    if rank["role"] == "head":
        if not head_ran:
            return None
        if status != 0:
            return "%s exited %s: %s" % (who, status, exit_meaning(status, rank.get("stalled")))
        return None
    if status is None:
        return None
    removed = runtime == "prima" and parse_prima_rank(rank.get("stderr", ""))["removed"]
    if runtime == "prima" and (status == 0 or removed):
        return None
    return "%s exited %s during the run: %s" % (who, status, exit_meaning(status, rank.get("stalled")))


# Exits that follow a peer's loss rather than cause it: timeout's hang (a lost ring rank), a stall
# (the ring waiting on a dead or stalled peer goes quiet too), abort (llama.cpp's "Remote RPC server
# crashed"), SIGPIPE (a head gone). Ranks ending so are listed after the others, whatever the clocks
# say: a wrapper notes its rank's end only once it is scheduled, so on a busy node the consequence can
# be stamped before its cause. Among stalls, the first to end fell quiet first.
CONSEQUENCES = (124, STALL_EXIT, 134, 141)


def rank_problems(runtime: str, ranks: Sequence[Mapping[str, Any]], tail_lines: int = 15) -> List[str]:
    """What went wrong, cause first: ranks that never started, then ranks that ended on their own
    account, then those whose exit follows a peer's loss (CONSEQUENCES), each in the order they ended.

    The first rank to die is usually the cause (a killed head takes its RPC workers down with
    SIGPIPE; a killed worker makes the head abort). A prima.cpp worker exits 0 a second after
    the head (or when the allocator leaves it no layer); a ggml-rpc-server never exits on its
    own, even a start-up error exits 0, so any exit of an RPC worker before it was stopped is
    a failure.
    """
    head_ran = any(rank["role"] == "head" and rank.get("exit") is not None for rank in ranks)
    problems = []  # type: List[str]
    ordered = sorted(ranks, key=lambda rank: (not rank.get("listen_error"), rank.get("exit") in CONSEQUENCES,
                                              rank.get("ended") is None, rank.get("ended") or 0.0, rank["rank"]))
    for rank in ordered:
        problem = _rank_problem(rank, runtime, head_ran)
        if problem:
            last = tail(rank.get("stderr", ""), tail_lines)
            problems.append(problem + ("\n  last lines of its stderr:\n    " + last.replace("\n", "\n    ")
                                       if last else "\n  (its stderr is empty)"))
    for rank in ordered:
        if rank.get("left_running"):
            problems.append("%s is still running after SIGKILL (pid %s): stop it by hand"
                            % (_who(rank, runtime), rank.get("pid")))
    return problems


def log_was_cut(ranks: Sequence[Mapping[str, Any]], record: Mapping[str, Any]) -> bool:
    """The head exited 0 yet its log has no perf line: llama.cpp's logger thread is never joined
    (its singleton is leaked on purpose), so what it had not yet written is lost at exit."""
    head = next(rank for rank in ranks if rank["role"] == "head")
    return head.get("exit") == 0 and not any(value is not None for value in record["perf"].values())


def run_record(plan: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]], head_stderr: str,
               meta: Mapping[str, Any]) -> Dict[str, Any]:
    """The figures of one run: the head's perf lines, the split each prima.cpp rank used."""
    figures = parse_perf(head_stderr) or {}
    record = dict(meta)
    record.update({
        "mode": "run", "runtime": plan["runtime"], "model": plan["model"], "unit": plan["name"],
        "world": plan["world"], "hosts": list(plan["hosts"]), "split": plan["split"], "perf": figures,
    })
    if plan["runtime"] == "prima":
        used = []
        for rank in sorted(ranks, key=lambda item: item["rank"]):
            parsed = parse_prima_rank(rank.get("stderr", ""))
            used.append({"rank": rank["rank"], "host": rank["host"], "window": parsed["window"],
                         "gpu_layers": parsed["gpu_layers"], "removed": parsed["removed"]})
        record["ranks"] = used
        profile = parse_prima_rank(head_stderr)["profile"]
        if profile:
            # prima.cpp's own profile of each device (printed when its allocator runs).
            record["device_profile"] = [dict(summary, rank=number, host=host) for number, (summary, host)
                                        in enumerate(zip(profile_summary(profile), plan["hosts"]))]
        if plan.get("window") is None:
            kept = [item for item in used if not item["removed"]]
            record["split"] = "prima.cpp allocator: " + ",".join(
                "%s=%s" % (item["host"], item["window"]) for item in kept)
    return record
