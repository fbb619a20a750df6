# Sourced by bench/setup_*.sh: each peer lives in an environment of its own, bench/.venv-NAME.
# A venv hard-codes its own path, so it is built in place; `.complete` marks a finished one (finish_venv), and an
# unfinished one is removed and rebuilt.

# start_venv NAME OVERRIDE_VAR: sets $venv ($OVERRIDE_VAR, or bench/.venv-NAME), $python and the install command
# ${pip[@]}, after creating an empty venv; exits the script (0) when a finished one is there already.
start_venv() {
  local name=$1 override=$2
  local here
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  venv="${!override:-$here/.venv-$name}"
  python="${PYTHON:-python3.11}"
  if [[ -f "$venv/.complete" ]]; then
    echo "$name venv ready: $venv"
    exit 0
  fi
  rm -rf "$venv"
  trap 'rm -rf "$venv"' ERR
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
}

finish_venv() {
  touch "$venv/.complete"
}

# pip_q ARGS...: the venv's pip, without the noise of this machine's local index (as scripts/setup.sh); a failed
# install still fails the script.
pip_q() {
  local log rc=0
  log=$(mktemp)
  "${pip[@]}" "$@" >"$log" 2>&1 || rc=$?
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
  return "$rc"
}
