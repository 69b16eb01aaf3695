"""python3 plugins/perflog.py FILE [FILE...]: the perf figures of captured llama.cpp / prima.cpp logs (or of
llama-server answers, by their `timings`), as JSON.

A thin entry point: the parser is plugins/plugin_utils/bench/perflog.py (standard library only), run from its file.
"""

import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_utils", "bench", "perflog.py"),
                   run_name="__main__")
