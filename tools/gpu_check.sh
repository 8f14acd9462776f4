#!/usr/bin/env bash
# The GPU check on the lent device machine: install the carried wheels (.whl/, see `make gpu-wheels`)
# into /tmp/site, put them and this repository on PYTHONPATH, run `python3 -m tools.gpu_check`. Arguments go to
# the check; results land in $OUT (the device tool's folder that comes back), else out/gpu-check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "gpu_check.sh: no wheels in .whl/: run 'make gpu-wheels' on the dev machine and carry .whl" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec python3 -m tools.gpu_check "$@"
