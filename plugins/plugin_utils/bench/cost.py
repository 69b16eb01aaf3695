"""What a bench run cost, from each node's hourly price (pure functions, standard library).

A node's price is its inventory's `glows_price_cent`: US cents per hour (65 means $0.65/h), as the
Glows inventory gives it; hosts of a static inventory have none unless it is set by hand, and 0 is
none (an API's answer for a price it does not know). A cost over nodes of which any has no price is
unknown, and says which. Anything else that is not a positive number is refused (price_problems).

- The run's cost: the nodes' prices added up, times the wall time from the start of bench.yml's
  benchmark (`bench_started` in every record) to the end of its last run (the latest `finished`).
- Dollars per million generated tokens, for a row of the report (or one run): the prices of the
  nodes that run holds (its `hosts`), times the time one token takes at the measured decode rate
  (ms per generated token), for a million tokens. Prompt tokens are not counted.
"""

import datetime
import decimal
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

PRICE_VAR = "glows_price_cent"
# The record's and profile's field: {host: cents per hour or None} in a record, a number or None per node.
PRICE_FIELD = "price_cent_per_hour"
Price = Union[int, float]


def node_price(value: Any) -> Optional[Price]:
    """A node's price in US cents per hour, as a positive finite number; None when none is given (unset or 0).

    A string of digits (an extra var) is read as a number. Anything else (a negative number, a boolean,
    text, NaN, infinity, a number too large for a float) raises ValueError saying why.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("%r is a boolean, not a price" % value)
    number = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text) if text.isdigit() else float(text)
        except ValueError:
            raise ValueError("%r is not a number" % value) from None
    if not isinstance(number, (int, float)):
        raise ValueError("%r is not a number" % (value,))
    try:
        finite = math.isfinite(float(number))
    except OverflowError:
        raise ValueError("%s is too large to be a price" % value) from None
    if not finite:
        raise ValueError("%r is not a finite number" % (value,))
    if number == 0:
        return None
    if number < 0:
        raise ValueError("%r is not a positive number" % (value,))
    return number


def price_problem(host: str, value: Any) -> Optional[str]:
    """Why a host's glows_price_cent cannot be used, or None when it can (or is not set)."""
    try:
        node_price(value)
    except ValueError as error:
        return ("host %s: %s %s: give the price in US cents per hour, a positive number (65 means $0.65/h), "
                "or leave it unset (or 0) for none" % (host, PRICE_VAR, error))
    return None


def price_problems(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> List[str]:
    """Every host whose glows_price_cent is set to something that is not a price."""
    problems = [price_problem(host, _var(hostvars, host)) for host in hosts]
    return [problem for problem in problems if problem]


def host_prices(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, Optional[Price]]:
    """{host: cents per hour or None}, for the record of a run or the profile of a node."""
    return {host: node_price(_var(hostvars, host)) for host in hosts}


def _var(hostvars: Mapping[str, Any], host: str) -> Any:
    variables = hostvars[host]
    return variables.get(PRICE_VAR) if hasattr(variables, "get") else None


def record_prices(record: Mapping[str, Any]) -> Dict[str, Any]:
    """The prices of the hosts a run holds, as its record gives them (a host it names no price for: None)."""
    given = record.get(PRICE_FIELD) or {}
    return {host: given.get(host) for host in record.get("hosts") or []}


def hourly_usd(prices: Mapping[str, Any]) -> Tuple[Optional[float], List[str]]:
    """Dollars per hour for all these nodes together, and the nodes without a usable price (then None)."""
    unpriced = []  # type: List[str]
    cents = 0.0
    for host, value in prices.items():
        try:
            price = node_price(value)
        except ValueError:
            price = None
        if price is None:
            unpriced.append(host)
        else:
            cents += float(price)
    if unpriced or not prices or not math.isfinite(cents):
        return None, unpriced
    return cents / 100.0, unpriced


def usd_per_mtok(prices: Mapping[str, Any], ms_per_token: Any) -> Optional[float]:
    """Dollars for a million generated tokens at `ms_per_token`: (sum of the nodes' prices in $/h) / 3600
    x (ms per token / 1000) x 1e6. None when a node has no price or the time per token is not a positive number."""
    usd_per_hour, dummy = hourly_usd(prices)
    if usd_per_hour is None or isinstance(ms_per_token, bool) or not isinstance(ms_per_token, (int, float)):
        return None
    if not math.isfinite(ms_per_token) or ms_per_token <= 0:
        return None
    value = usd_per_hour / 3600.0 * (ms_per_token / 1000.0) * 1e6
    return value if math.isfinite(value) else None


def parse_time(text: Any) -> Optional[datetime.datetime]:
    """An ISO 8601 time as the records carry it (`2026-12-02T12:00:00Z`); without a zone, UTC. None if unreadable."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def wall_time_s(records: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """Seconds from the earliest `bench_started` to the latest `finished` of the records; None without both."""
    starts = [moment for moment in (parse_time(record.get("bench_started")) for record in records) if moment]
    ends = [moment for moment in (parse_time(record.get("finished")) for record in records) if moment]
    if not starts or not ends:
        return None
    seconds = (max(ends) - min(starts)).total_seconds()
    return seconds if seconds >= 0 else None


def run_cost(prices: Mapping[str, Any], seconds: Optional[float]) -> Dict[str, Any]:
    """What the run cost: every node's price times the wall time. `usd` is None when a node has no
    price (listed in `unpriced`) or the wall time is unknown."""
    usd_per_hour, unpriced = hourly_usd(prices)
    usd = None
    if usd_per_hour is not None and seconds is not None:
        usd = usd_per_hour * seconds / 3600.0
        usd = usd if math.isfinite(usd) else None
    return {"usd": usd, "usd_per_hour": usd_per_hour, "wall_s": seconds, "nodes": len(prices),
            "unpriced": unpriced}


def node_prices(profile: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Every node's price: from the cluster profile (all the benchmark's nodes), else from the runs' records."""
    if profile:
        return {str(node["host"]): node.get(PRICE_FIELD) for node in profile}
    prices = {}  # type: Dict[str, Any]
    for record in records:
        for host, value in record_prices(record).items():
            prices.setdefault(host, value)
    return prices


def _rounded(value: float, places: int) -> decimal.Decimal:
    """Half up, on the number as it prints (2.105 is 2.11, though the float is a hair under 2.105)."""
    context = decimal.Context(prec=340, rounding=decimal.ROUND_HALF_UP)  # room for any finite float's digits
    return decimal.Decimal(repr(float(value))).quantize(decimal.Decimal(1).scaleb(-places), context=context)


def money(usd: Optional[float]) -> str:
    """$0.12, $1,234.50; `< $0.01` for an amount that rounds to nothing; `unknown` for None."""
    if usd is None:
        return "unknown"
    if 0 < usd < 0.005:
        return "< $0.01"
    return "${:,}".format(_rounded(usd, 2))


def mtok_cell(row: Mapping[str, Any]) -> str:
    """A results row's $/Mtok: `unknown` when one of its nodes has no price, `—` when its decode rate is unknown."""
    if row.get("usd_per_mtok") is not None:
        return money(row["usd_per_mtok"])
    return "unknown" if hourly_usd(row.get(PRICE_FIELD) or {})[0] is None else "—"


def price_cell(value: Any) -> str:
    """A node's price in dollars per hour for the profile table (cents / 100, at least two decimals,
    a fraction of a cent kept); `unknown` for a node without a usable price."""
    try:
        cents = node_price(value)
    except ValueError:
        cents = None
    if cents is None:
        return "unknown"
    text = "{:,}".format(_rounded(cents / 100.0, 4))
    return text[:-2] + text[-2:].rstrip("0")


def duration_text(seconds: float) -> str:
    """3 min 42 s; 1 h 0 min 5 s; 42 s (to the second)."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return "%d h %d min %d s" % (hours, minutes, secs)
    if minutes:
        return "%d min %d s" % (minutes, secs)
    return "%d s" % secs


def cost_text(cost: Mapping[str, Any]) -> str:
    """The report's line: `$0.12 (3 nodes, $1.95/h together, 3 min 42 s of wall time)`, or `unknown (why)`."""
    if cost["unpriced"]:
        return ("unknown (no price for %s: the inventory gives none; Glows inventories carry %s)"
                % (", ".join(cost["unpriced"]), PRICE_VAR))
    if not cost["nodes"]:
        return "unknown (no nodes)"
    if cost["usd_per_hour"] is None:
        return "unknown (the nodes' prices add up to more than a number holds)"
    if cost["wall_s"] is None:
        return ("unknown (%s/h together, but the records give no wall time: no bench_started or finished in them)"
                % money(cost["usd_per_hour"]))
    if cost["usd"] is None:
        return "unknown (too large to compute)"
    return "%s (%d node%s, %s/h together, %s of wall time)" % (
        money(cost["usd"]), cost["nodes"], "" if cost["nodes"] == 1 else "s", money(cost["usd_per_hour"]),
        duration_text(cost["wall_s"]))


def report_cost(records: Sequence[Mapping[str, Any]], profile: Sequence[Mapping[str, Any]]) -> str:
    """The cost line of a report over these records and this profile."""
    return cost_text(run_cost(node_prices(profile, records), wall_time_s(records)))
