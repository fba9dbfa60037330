#!/usr/bin/env bash
# Create .venv (once) and install policyport into it, editable, with the extras given as $1
# (comma-separated, e.g. "test" or "test,bench"; empty for the core only).
#
# The install is skipped when nothing it depends on changed since the last one for the same extras:
# pyproject.toml, this script and the interpreter are hashed into a stamp file in .venv. The package
# itself is installed editable, so changes to its code need no install. SETUP_FORCE=1 installs anyway.
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
stamp=".venv/.policyport-setup-${extras:-core}"
wanted=$(cat pyproject.toml scripts/setup.sh | .venv/bin/python -c \
  'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read() + sys.version.encode()).hexdigest())')
if [ "${SETUP_FORCE:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] \
    && .venv/bin/python -c 'import policyport' 2>/dev/null; then
  echo "setup: .venv is up to date for extras '${extras:-core}' (SETUP_FORCE=1 reinstalls)" >&2
else
  rm -f "$stamp"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
  case ",$extras," in
    *,test,*)
      # The Cast tests run once more under each ml_dtypes release whose conversions differ (0.5 wraps
      # out-of-range floats cast to int4, 0.7 gives 0): policyport must give the same values under both.
      for version in 0.5 0.7; do
        rm -rf ".venv/ml_dtypes-$version"
        .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
          --target ".venv/ml_dtypes-$version" "ml_dtypes==$version.*"
      done
      # onnx2torch, for the test that compares to-torch with it, without its dependencies: its torchvision
      # pulls a torch other than the pinned CPU build (and torchvision's own wheels do not load with that one).
      rm -rf .venv/onnx2torch
      .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
        --target .venv/onnx2torch "onnx2torch==1.5.15"
      ;;
  esac
  echo "$wanted" > "$stamp"
fi
# pip byte-compiles a package it installs from a wheel, but not one installed editable: compile the
# source tree as well, so that the command line starts from bytecode as an installed copy does, also
# where PYTHONDONTWRITEBYTECODE keeps Python from caching it (compiling every module of
# `policyport run` from source costs some 50 ms of its start-up). Stale files are recompiled.
.venv/bin/python -m compileall -q policyport
