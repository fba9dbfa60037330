#!/usr/bin/env bash
# Create .venv (once) and install policyport into it, editable, with the extras given as $1
# (comma-separated, e.g. "test" or "test,bench"; empty for the core only).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "policyport needs Python 3.10 or newer; set PYTHON=/path/to/python3.11" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extras=${1:-}
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
# pip byte-compiles a package it installs from a wheel, but not one installed editable: compile the
# source tree as well, so that the command line starts from bytecode as an installed copy does, also
# where PYTHONDONTWRITEBYTECODE keeps Python from caching it (compiling every module of
# `policyport run` from source costs some 50 ms of its start-up). Stale files are recompiled.
.venv/bin/python -m compileall -q policyport
