"""benchmarks/figures.py: every benchmark's figures as JSON and markdown, in one place."""

import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
sys.path.insert(0, BENCHMARKS)

from figures import write_figures  # noqa: E402  # pylint: disable=wrong-import-position


def test_the_figures_are_written_as_json_and_markdown_and_printed(tmp_path, capsys):
    write_figures("rpc-cache", {"b": 1, "a": [1.5]}, "# Title\n", out_dir=str(tmp_path / "artifacts"))
    assert json.loads((tmp_path / "artifacts" / "rpc-cache.json").read_text()) == {"a": [1.5], "b": 1}
    assert (tmp_path / "artifacts" / "rpc-cache.json").read_text().startswith('{\n  "a"')
    assert (tmp_path / "artifacts" / "rpc-cache.md").read_text() == "# Title\n"
    assert capsys.readouterr().out == "# Title\n\n"


@pytest.mark.parametrize("script", ["rpc_cache.py", "models_fanout.py", "tunnel_cost.py", "bench_overhead.py"])
def test_every_benchmark_starts(script):
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
