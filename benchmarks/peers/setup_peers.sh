#!/usr/bin/env bash
# Create (if missing) the peer-benchmark virtualenv and install requirements-peers.txt.
# Idempotent: re-running only installs what is missing. Override the location with PEERS_VENV.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${PEERS_VENV:-$root/.venv-peers}"
req="$here/requirements-peers.txt"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "Creating $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)

# torch first, so the CPU build is chosen before anything pulls in a CUDA one.
torch_pin="$(grep -E '^torch==' "$req")"
"${pip[@]}" "$torch_pin"
"${pip[@]}" -r "$req"

"$venv/bin/python" -c "import d3rlpy, gymnasium, h5py, jax, mujoco, sbx, torch; print('peers ok: sbx', sbx.__version__, 'd3rlpy', d3rlpy.__version__, 'jax', jax.__version__, 'torch', torch.__version__)"
