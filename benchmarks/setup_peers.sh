#!/bin/bash
# setup_peers.sh: builds .venv-peers, the virtualenv of the peer implementations that the
# benchmarks compare BatchPPO against (Stable-Baselines3 on CPU torch; rejax on CPU JAX and
# gymnax), from benchmarks/peers.lock.
#
#   benchmarks/setup_peers.sh            create or update .venv-peers; prints its python
#   benchmarks/setup_peers.sh --relock   regenerate peers.lock from peers.in (then run it again)
#
# Idempotent: a stamp inside .venv-peers records the sha256 of the lock it was built from, so
# with nothing to do it costs a hash. It is the only thing that installs SB3, torch, rejax and
# JAX; the runtime's .venv, the tests and CI never do.
#
# torch is pinned to its CPU build (+cpu), which PyPI does not serve: pip finds it through
# --find-links $BATCHPPO_TORCH_WHEELS (default /opt/wheels, where this machine keeps it; elsewhere
# point it at a directory or page holding torch-2.13.0+cpu for CPython 3.11).
set -uo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
requirements="$root/benchmarks/peers.in"
lock="$root/benchmarks/peers.lock"
venv="$root/.venv-peers"
stamp="$venv/.batchppo-peers-lock-sha256"
wheels=${BATCHPPO_TORCH_WHEELS:-/opt/wheels}
python_version=3.11

say() { echo "setup_peers: $*" >&2; }

die() {
  say "error: $1"
  if [ $# -gt 1 ] && [ -s "$2" ]; then
    say "last lines of its log ($2):"
    tail -n 15 "$2" | sed 's/^/    /' >&2
  fi
  exit 1
}

relock() {
  local uv="$root/.venv/bin/uv"
  [ -x "$uv" ] || uv=$(command -v uv || true)
  [ -n "$uv" ] || die "uv not found; run ./bazelw once (it installs uv into .venv) or install uv"
  cd "$root" || exit 1
  "$uv" pip compile \
    --python-version "$python_version" --python-platform x86_64-manylinux_2_28 \
    --generate-hashes --annotation-style split --find-links "$wheels" \
    --custom-compile-command "benchmarks/setup_peers.sh --relock" \
    benchmarks/peers.in -o benchmarks/peers.lock
}

find_python() {
  local candidate
  for candidate in "${BATCHPPO_PYTHON:-}" "python$python_version" python3; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c "import sys, venv; sys.exit('%d.%d' % sys.version_info[:2] != \
'$python_version')" 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

is_current() {
  [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$1" ]
}

install() {
  [ -f "$lock" ] || die "$lock is missing; restore it (git checkout -- benchmarks/peers.lock)"
  local want
  want=$(sha256sum "$lock" | cut -d' ' -f1)
  if is_current "$want"; then
    echo "$venv/bin/python"
    return 0
  fi
  # One installer at a time; a concurrent run waits, then finds the work done.
  exec 9<"$lock"
  flock 9
  if is_current "$want"; then
    echo "$venv/bin/python"
    return 0
  fi
  local python log
  python=$(find_python) || die "no CPython $python_version with the venv module found (install \
python$python_version-venv or point BATCHPPO_PYTHON at one)"
  log=$(mktemp "${TMPDIR:-/tmp}/setup_peers.XXXXXX.log")
  say "building .venv-peers from benchmarks/peers.lock (about a minute; log: $log) ..."
  rm -rf "$venv"
  "$python" -m venv "$venv" >>"$log" 2>&1 || {
    rm -rf "$venv"
    die "could not create the virtualenv ($python -m venv $venv)" "$log"
  }
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --require-hashes \
    --no-deps --find-links "$wheels" -r "$lock" >>"$log" 2>&1 || {
    rm -rf "$venv"
    die "pip install -r benchmarks/peers.lock failed; is PyPI reachable and does \
BATCHPPO_TORCH_WHEELS ($wheels) hold torch-2.13.0+cpu?" "$log"
  }
  "$venv/bin/python" -m pip check --disable-pip-version-check >>"$log" 2>&1 || {
    rm -rf "$venv"
    die "the lock's packages conflict; regenerate it: benchmarks/setup_peers.sh --relock" "$log"
  }
  echo "$want" >"$stamp"
  rm -f "$log"
  say ".venv-peers is ready."
  echo "$venv/bin/python"
}

case "${1:-}" in
  "") install ;;
  --relock) relock ;;
  *) die "unknown argument '$1'; usage: benchmarks/setup_peers.sh [--relock]" ;;
esac
