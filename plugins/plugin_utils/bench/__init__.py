"""bench.yml: the checks across ranks, the runs judged, their logs parsed, records, estimates, costs, reports."""
