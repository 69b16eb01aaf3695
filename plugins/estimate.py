"""python3 plugins/estimate.py --gguf FILE [...]: what a split model costs on the wire and in memory.

A thin entry point: the estimator is plugins/plugin_utils/estimate.py (it needs the gguf library), run from its file.
"""

import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_utils", "estimate.py"),
                   run_name="__main__")
