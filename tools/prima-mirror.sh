#!/usr/bin/env bash
# Which local git mirror of prima.cpp should the sandbox demo build from?
#
# Prints the absolute path of a usable mirror on stdout, or nothing (after a NOTICE on stderr)
# when prima.cpp has to be left out; exits 1 only when the user's own choice is wrong.
# The sandbox bind-mounts the mirror read-only at /srv/prima-mirror and the prima role clones
# it there, so the pinned commit must be reachable from a branch (a clone takes refs only).
#
#   PRIMA_CPP_MIRROR   a mirror the user already has (bare or not); checked, never fetched into
#   PRIMA_CPP_VERSION  the commit to require instead of prima_version (tests, other pins)
#   PRIMA_CPP_REPO     where to fetch from instead of prima_repo (tests point it at a local repo)
#   XDG_CACHE_HOME     the fetched mirror lives in ${XDG_CACHE_HOME:-$HOME/.cache}/prima-cluster
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
prima_defaults="$script_dir/../roles/prima/defaults/main.yml"

fail() {
  printf 'prima-mirror: %s\n' "$1" >&2
  exit 1
}

notice_and_leave_out() {
  printf 'NOTICE: prima.cpp is left out of the demo: %s. To include it: PRIMA_CPP_MIRROR=/path/to/a/clone/of/prima.cpp holding commit %s make demo\n' \
    "$1" "$commit" >&2
  exit 0
}

# The value of a top-level `key: value` line of the role defaults. sed rather than PyYAML because
# this runs before `make venv` on a fresh machine; both keys are plain one-line scalars.
role_default() {
  local key=$1 value
  value=$(sed -n -E "s/^$key:[[:space:]]*['\"]?([^'\" #]+)['\"]?[[:space:]]*(#.*)?\$/\\1/p" "$prima_defaults")
  [[ -n $value && $value != *$'\n'* ]] ||
    fail "found no single '$key: <value>' line in $prima_defaults; keep $key a plain one-line value there"
  printf '%s' "$value"
}

# The last non-empty line of a git error: the one that says what went wrong, on one line for the NOTICE.
one_line() {
  local text=$1 line last=""
  while IFS= read -r line; do
    [[ -n ${line//[[:space:]]/} ]] && last=$line
  done <<<"$text"
  printf '%s' "${last:-no error text}"
}

holds_commit() {
  git --git-dir="$1" cat-file -e "$commit^{commit}" 2>/dev/null
}

[[ -r $prima_defaults ]] || fail "cannot read $prima_defaults (prima_repo, prima_version); run this from a checkout of the collection"

commit=${PRIMA_CPP_VERSION:-$(role_default prima_version)}
repo=${PRIMA_CPP_REPO:-$(role_default prima_repo)}
[[ $commit =~ ^([0-9a-f]{40}|[0-9a-f]{64})$ ]] ||
  fail "the commit to require is '$commit' (PRIMA_CPP_VERSION, else prima_version in $prima_defaults); name a full 40-digit commit"
# A repository starting with '-' would reach git as an option.
[[ -n $repo && $repo != -* ]] ||
  fail "the repository to fetch from is '$repo' (PRIMA_CPP_REPO, else prima_repo in $prima_defaults); name a URL or path"

# Never read a parent repository's objects when the path given is not a repository itself.
export GIT_TERMINAL_PROMPT=0
unset GIT_DIR GIT_WORK_TREE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES

if [[ -n ${PRIMA_CPP_MIRROR:-} ]]; then
  mirror=$PRIMA_CPP_MIRROR
  # The path is bind-mounted into every node and read through Jinja: control characters, ';',
  # quotes, '$' or '`' never belong to a real path there and mostly mean a bad paste.
  if [[ $mirror =~ [[:cntrl:]\;\$\`\"\'\\] ]]; then
    fail "PRIMA_CPP_MIRROR=$(printf '%q' "$mirror") holds a control character, ';', a quote, '\$', '\`' or '\\'; set it to the plain path of a clone of prima.cpp"
  fi
  [[ -d $mirror ]] ||
    fail "PRIMA_CPP_MIRROR=$mirror is not a directory; set it to a clone of prima.cpp holding commit $commit, or unset it to let the demo fetch one"
  mirror=$(cd "$mirror" && pwd -P)
  # Stop git's search for a repository at the mirror itself, so a plain directory inside some
  # other checkout is not taken for a mirror.
  git_dir=$(GIT_CEILING_DIRECTORIES=$(dirname "$mirror") git -C "$mirror" rev-parse --absolute-git-dir 2>/dev/null) ||
    fail "PRIMA_CPP_MIRROR=$mirror is not a git repository; point it at a clone of prima.cpp (git clone --mirror $repo /path/to/prima.cpp.git) or unset PRIMA_CPP_MIRROR to let the demo fetch one"
  holds_commit "$git_dir" ||
    fail "PRIMA_CPP_MIRROR=$mirror does not hold commit $commit; fetch it there (git -C $mirror fetch $repo $commit && git -C $mirror branch prima-pinned $commit) or point PRIMA_CPP_MIRROR at a clone that holds it"
  # The nodes clone the mirror, and a clone carries branches and tags only.
  [[ -n $(git --git-dir="$git_dir" for-each-ref --count=1 --contains "$commit" refs/heads refs/tags) ]] ||
    fail "PRIMA_CPP_MIRROR=$mirror holds commit $commit but on no branch or tag, so a clone of it would not; add one: git -C $mirror branch prima-pinned $commit"
  printf '%s\n' "$mirror"
  exit 0
fi

cache_dir="${XDG_CACHE_HOME:-${HOME:?neither XDG_CACHE_HOME nor HOME is set; set one so the prima.cpp mirror has a cache directory}/.cache}/prima-cluster"
cache="$cache_dir/prima.cpp.git"

if holds_commit "$cache"; then
  printf '%s\n' "$cache"
  exit 0
fi

if ! ls_remote_error=$(timeout 20 git ls-remote "$repo" HEAD 2>&1 >/dev/null); then
  [[ -n ${ls_remote_error//[[:space:]]/} ]] || ls_remote_error="no answer within 20 s"
  notice_and_leave_out "no mirror given (PRIMA_CPP_MIRROR) and $repo cannot be reached from this controller ($(one_line "$ls_remote_error"))"
fi

mkdir -p "$cache_dir" || fail "cannot create $cache_dir; make it writable or set XDG_CACHE_HOME to a writable directory"
# Two demos started together: the second waits here and then finds the first one's fetch.
exec {lock_fd}>"$cache.lock"
flock -w 900 "$lock_fd" || fail "waited 15 min for $cache.lock (another fetch of prima.cpp); if none runs, remove that file"
if holds_commit "$cache"; then
  printf '%s\n' "$cache"
  exit 0
fi

# Fetch beside the cache and rename into place: a fetch cut short never looks like a mirror.
staging=$(mktemp -d "$cache.partial.XXXXXX")
trap 'rm -rf "$staging"' EXIT
# Ctrl-C or a kill ends through `exit`, so the EXIT trap still removes the partial fetch.
trap 'exit 1' INT TERM HUP
git -c init.defaultBranch=pinned init -q --bare "$staging"
echo "prima-mirror: fetching prima.cpp $commit from $repo into $cache (once)" >&2
if ! fetch_error=$(timeout 900 git --git-dir="$staging" fetch -q --depth 1 "$repo" "$commit" 2>&1); then
  notice_and_leave_out "fetching commit $commit from $repo failed ($(one_line "${fetch_error:-no answer within 15 min}"))"
fi
# A branch (HEAD points at it) so that a plain `git clone` of the mirror carries the commit.
git --git-dir="$staging" update-ref refs/heads/pinned "$commit"
if [[ -e $cache ]]; then
  # A mirror of an older pin: replaced, not kept, so the cache never grows past one commit.
  stale="$cache.stale.$$"
  mv -T "$cache" "$stale"
  mv -T "$staging" "$cache"
  rm -rf "$stale"
else
  mv -T "$staging" "$cache"
fi
printf '%s\n' "$cache"
