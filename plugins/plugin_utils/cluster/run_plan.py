"""The run, computed once: what one bench.yml or serve.yml run does, from its command line and inventory.

Each playbook's first controller play calls the action prima.cluster.run_plan, which calls one of these: the
command line's values are checked here (every problem at once), the models and runtimes chosen here, and the
units named by the planner's own function. The plays after it take the parts as parameters (bench_run.models,
serve_run.unit...) and choose nothing again.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..bench.cost import price_problems
from ..bench.server import clients_problems, parse_clients
from ..launch.plan import plan_name, plan_names
from ..link.shaping import links_problems, parse_links
from ..models.catalog import model_selection_problems, models_selection
from ..preflight.checks import (
    RUNTIMES, choice_problems, positive_int_problems, runtime_words, runtimes_problems, runtimes_selection)
from ..serve.supervision import api_key_problems

BENCH_MODES = ("run", "server")
SERVE_STATES = ("started", "stopped", "restarted", "status")


class RunPlanError(ValueError):
    """Input a run cannot start with; `problems` are every one found, each naming its variable and the fix."""

    def __init__(self, playbook: str, problems: Sequence[str]):
        self.playbook = playbook
        self.problems = list(problems)
        super().__init__("%s input needs fixing:\n%s" % (playbook, "\n".join(self.problems)))


def _not_built(others: str) -> str:
    return ("runtime=prima: prima.cpp is not built on this cluster (prima_enabled is false); build it with "
            "site.yml (the sandbox needs PRIMA_CPP_MIRROR) or pick -e runtime=%s" % others)


def _given(value: Any) -> bool:
    return value is not None and str(value) != ""


def bench_run(values: Mapping[str, Any], catalog: Mapping[str, Any], prima_built: bool, api_key: Any,
              hosts: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, Any]:
    """bench.yml's run: {models, runtimes, plan_names, runs, mode, clients, link_steps, notices}.

    `values` holds the command line's model, runtime, runs, links, mode and clients (absent: their defaults);
    `hosts` and `hostvars` the cluster's, for their prices. Raises RunPlanError naming every problem."""
    model = values.get("model")
    runtime = values.get("runtime", "prima")
    runs = values.get("runs", 3)
    links = values.get("links", "")
    mode = str(values.get("mode", "run"))
    clients = values.get("clients", "")
    clients_given = _given(clients)
    runtimes_given = runtime_words(runtime)
    problems = (
        model_selection_problems(model, catalog)
        + runtimes_problems(runtime)
        + positive_int_problems(runs, "runs")
        + links_problems(links)
        + price_problems(hosts, hostvars)
        + ([] if "prima" not in runtimes_given or prima_built else [_not_built("llama_rpc,single (or all)")])
        + choice_problems(mode, BENCH_MODES, "mode")
        + (clients_problems(clients) if mode == "server" and clients_given else [])
        + (api_key_problems(api_key, "vault_serve_api_key",
                            "mode=server sends it with every request (llama-server requires a key)")
           if mode == "server" else []))
    if problems:
        raise RunPlanError("bench.yml", problems)
    models = models_selection(model, [], catalog)
    runtimes = runtimes_selection(runtime, prima_built)
    notices = []  # type: List[str]
    if mode != "server" and clients_given:
        notices.append("clients=%s is ignored: only -e mode=server runs the concurrency sweep" % clients)
    if runtimes_given == ["all"] and not prima_built:
        notices.append("runtime=all without prima.cpp: it is not built on this cluster (prima_enabled is false)")
    return {
        "models": models,
        "runtimes": runtimes,
        "plan_names": plan_names(runtimes, models),
        "runs": int(runs),
        "mode": mode,
        # mode=run ignores clients (a notice says so): only a server's sweep reads them.
        "clients": parse_clients(clients if mode == "server" else ""),
        "link_steps": parse_links(links),
        "notices": notices,
    }


def serve_run(values: Mapping[str, Any], catalog: Mapping[str, Any], prima_built: bool,
              api_key: Any) -> Dict[str, Any]:
    """serve.yml's run: {state, starts, model, runtime, unit}. `values` holds the command line's state, model
    and runtime (absent: started, none, prima). Raises RunPlanError naming every problem."""
    state = str(values.get("state", "started"))
    model = values.get("model")
    runtime = str(values.get("runtime", "prima"))
    starts = state in ("started", "restarted")
    problems = choice_problems(state, SERVE_STATES, "state")
    if starts:
        problems += model_selection_problems(model, catalog)
        if len(str(model or "").split(",")) > 1:
            problems.append("model: serve.yml serves one model at a time, not %s" % model)
    problems += choice_problems(runtime, RUNTIMES, "runtime")
    if starts and runtime == "prima" and not prima_built:
        problems.append(_not_built("llama_rpc|single"))
    if starts:
        problems += api_key_problems(api_key, "vault_serve_api_key", "every request must carry it")
    if problems:
        raise RunPlanError("serve.yml", problems)
    model_key = str(model) if _given(model) else ""
    return {"state": state, "starts": starts, "model": model_key, "runtime": runtime,
            "unit": plan_name(runtime, model_key, server=True)}


def run_plan(playbook: str, values: Mapping[str, Any], catalog: Mapping[str, Any], prima_built: bool,
             api_key: Any, hosts: Sequence[str] = (), hostvars: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The run of `playbook` (bench or serve)."""
    if playbook == "bench":
        return bench_run(values, catalog, prima_built, api_key, hosts, hostvars or {})
    if playbook == "serve":
        return serve_run(values, catalog, prima_built, api_key)
    raise ValueError("run_plan: playbook %r is not bench or serve" % (playbook,))
