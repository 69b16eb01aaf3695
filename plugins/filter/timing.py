"""Filters for timings Ansible reports."""

import re


def duration_seconds(delta: str) -> float:
    """A command result's `delta` ('0:04:12.123456', '1 day, 0:00:01') in seconds."""
    match = re.fullmatch(r"(?:(\d+) days?, )?(\d+):(\d{2}):(\d{2}(?:\.\d+)?)", str(delta).strip())
    if not match:
        raise ValueError("not a duration: %r" % (delta,))
    days, hours, minutes, seconds = match.groups()
    total = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    return round(total, 1)


class FilterModule:
    def filters(self):
        return {"duration_seconds": duration_seconds}
