"""tools/prima-mirror.sh, run for real against local git repositories: which mirror of prima.cpp
`make demo` hands to the sandbox, and the NOTICE when there is none."""

import os
import socket
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "prima-mirror.sh")


def git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def repo_with_commits(path, count=1):
    """A bare repository holding `count` commits on its default branch; returns it and the commits,
    oldest first. allowAnySHA1InWant lets a `fetch --depth 1 <sha>` over file:// take any of them."""
    work = str(path) + "-work"
    git("init", "-q", "-b", "main", work)
    commits = []
    for number in range(count):
        with open(os.path.join(work, "f"), "w") as handle:
            # The path in the content: two repositories never make the same commit.
            handle.write("%s %d" % (path, number))
        git("add", "f", cwd=work)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c%d" % number, cwd=work)
        commits.append(git("rev-parse", "HEAD", cwd=work))
    git("clone", "-q", "--bare", work, str(path))
    git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=str(path))
    return str(path), commits


def closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return "http://127.0.0.1:%d/prima.cpp.git" % port


@pytest.fixture
def env(tmp_path):
    """The script's environment, cut off from the user's git config, caches and proxies."""
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("GIT_") and key.lower() not in ("http_proxy", "https_proxy", "all_proxy")
               and key not in ("PRIMA_CPP_MIRROR", "PRIMA_CPP_VERSION", "PRIMA_CPP_REPO")}
    environ.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"), GIT_CONFIG_NOSYSTEM="1")
    return environ


def run(environ, **overrides):
    return subprocess.run([SCRIPT], env={**environ, **overrides}, capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_given_mirror_holding_the_commit_is_printed(tmp_path, env):
    mirror, (commit,) = repo_with_commits(tmp_path / "mirror.git")
    result = run(env, PRIMA_CPP_MIRROR=mirror, PRIMA_CPP_VERSION=commit)
    assert (result.returncode, result.stdout, result.stderr) == (0, mirror + "\n", "")


def test_a_given_mirror_without_the_commit_fails_naming_it(tmp_path, env):
    mirror, dummy = repo_with_commits(tmp_path / "mirror.git")
    dummy, (elsewhere,) = repo_with_commits(tmp_path / "other.git")
    result = run(env, PRIMA_CPP_MIRROR=mirror, PRIMA_CPP_VERSION=elsewhere)
    assert result.returncode == 1 and result.stdout == ""
    assert "PRIMA_CPP_MIRROR=%s does not hold commit %s" % (mirror, elsewhere) in result.stderr
    assert "git -C %s fetch" % mirror in result.stderr


def test_a_given_mirror_holding_the_commit_on_no_branch_fails(tmp_path, env):
    # A clone (what the nodes do) would not carry the commit.
    mirror, (commit, newer) = repo_with_commits(tmp_path / "mirror.git", count=2)
    git("update-ref", "refs/heads/main", commit, cwd=mirror)
    result = run(env, PRIMA_CPP_MIRROR=mirror, PRIMA_CPP_VERSION=newer)
    assert result.returncode == 1
    assert "PRIMA_CPP_MIRROR=%s holds commit %s but on no branch or tag" % (mirror, newer) in result.stderr


def test_a_directory_inside_another_repository_is_no_mirror(tmp_path, env):
    mirror, (commit,) = repo_with_commits(tmp_path / "mirror.git")
    result = run(env, PRIMA_CPP_MIRROR=os.path.join(mirror, "refs"), PRIMA_CPP_VERSION=commit)
    assert result.returncode == 1 and "is not a git repository" in result.stderr


@pytest.mark.parametrize("value", ["/tmp/x\n/tmp/y", "/tmp/x;rm -rf /", "/tmp/$(id)"])
def test_a_mirror_path_with_a_newline_or_a_semicolon_is_refused(tmp_path, env, value):
    result = run(env, PRIMA_CPP_MIRROR=value)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("prima-mirror: PRIMA_CPP_MIRROR=")
    assert "set it to the plain path of a clone of prima.cpp" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_no_mirror_and_no_github_leaves_prima_out_with_a_notice(tmp_path, env):
    url = closed_port_url()
    commit = "0123456789abcdef0123456789abcdef01234567"
    result = run(env, PRIMA_CPP_REPO=url, PRIMA_CPP_VERSION=commit)
    assert (result.returncode, result.stdout) == (0, "")
    notice = result.stderr.strip()
    assert len(notice.splitlines()) == 1
    assert notice.startswith("NOTICE: prima.cpp is left out of the demo: no mirror given (PRIMA_CPP_MIRROR) and "
                             "%s cannot be reached from this controller (" % url)
    assert notice.endswith("). To include it: PRIMA_CPP_MIRROR=/path/to/a/clone/of/prima.cpp holding commit "
                           "%s make demo" % commit)
    assert not os.path.exists(tmp_path / "cache" / "prima-cluster" / "prima.cpp.git")


def test_the_pinned_commit_comes_from_the_role_defaults(tmp_path, env):
    result = run(env, PRIMA_CPP_REPO=closed_port_url())
    with open(os.path.join(ROOT, "roles", "prima", "defaults", "main.yml")) as handle:
        pin = [line.split(":", 1)[1].strip() for line in handle if line.startswith("prima_version:")][0]
    assert result.returncode == 0 and result.stderr.strip().endswith("holding commit %s make demo" % pin)


def test_a_reachable_repository_is_fetched_once_into_the_cache(tmp_path, env):
    source, (old, commit) = repo_with_commits(tmp_path / "source.git", count=2)
    cache = str(tmp_path / "cache" / "prima-cluster" / "prima.cpp.git")
    first = run(env, PRIMA_CPP_REPO="file://" + source, PRIMA_CPP_VERSION=commit)
    assert (first.returncode, first.stdout) == (0, cache + "\n"), first.stderr
    git("--git-dir", cache, "cat-file", "-e", commit + "^{commit}")
    # What the sandbox does with it: a plain clone, then a checkout of the commit.
    clone = str(tmp_path / "node-clone")
    git("clone", "-q", cache, clone)
    git("checkout", "-q", commit, cwd=clone)
    assert [name for name in os.listdir(os.path.dirname(cache)) if "partial" in name or "stale" in name] == []

    second = run(env, PRIMA_CPP_REPO=closed_port_url(), PRIMA_CPP_VERSION=commit)
    assert (second.returncode, second.stdout, second.stderr) == (0, cache + "\n", "")

    # Another pin: fetched again, and the cache now holds that one.
    third = run(env, PRIMA_CPP_REPO="file://" + source, PRIMA_CPP_VERSION=old)
    assert (third.returncode, third.stdout) == (0, cache + "\n"), third.stderr
    git("--git-dir", cache, "cat-file", "-e", old + "^{commit}")
