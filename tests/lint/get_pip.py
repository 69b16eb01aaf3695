"""Stand-in for pip's get-pip.py, which ansible-test downloads from a host this machine cannot reach.

ansible-test bootstraps pip into each sanity test's empty virtual environment by running
~/.ansible/test/cache/get_pip_<version>.py with pip's arguments (`pip==24.2 --no-setuptools ...`).
This does the same with what Python ships: ensurepip, then pip itself installs the pinned packages
from the package index. tests/lint/test_collection.py puts it there when the cache has none.
"""

import subprocess
import sys


def main(argv):
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    packages = [arg for arg in argv if arg not in ("--no-setuptools", "--no-wheel")]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet"] + packages, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
