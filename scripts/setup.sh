#!/usr/bin/env bash
# Sets up Lifeline on a fresh machine: a virtual environment in .venv with the package
# and its test, azure, gcs and hf extras. Idempotent and quick when already done. Needs Python 3.11+ and
# (for the dev cluster and the GCS tests' fake-gcs-server, built later on first use and cached) a Go
# toolchain; the Azure storage tests install the Azurite emulator with npm on first use (cached too).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.lifeline-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # uv (from PyPI) installs from its cache (~/.cache/uv) by links: a fresh .venv takes ~10 s here
  # where pip took ~90 s (torch and its CUDA wheels unpacked again); it resolves as pip does
  .venv/bin/python -m pip install -q uv
  .venv/bin/uv pip install --python .venv/bin/python -q -e '.[test,azure,gcs,hf]'
  touch "$stamp"
fi
