"""What the benchmarks share: their figures written to artifacts/, as JSON and as the markdown they print."""

import json
import os
from typing import Any, Mapping

ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "artifacts")


def write_figures(name: str, result: Mapping[str, Any], text: str, out_dir: str = ARTIFACTS) -> None:
    """out_dir/<name>.json (indented, keys sorted) and out_dir/<name>.md, then the markdown on stdout."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + ".json"), "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
        handle.write("\n")
    with open(os.path.join(out_dir, name + ".md"), "w") as handle:
        handle.write(text)
    print(text)
