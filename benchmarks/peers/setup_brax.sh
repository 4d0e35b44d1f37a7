#!/usr/bin/env bash
# Create (if missing) the brax.training virtualenv and install requirements-brax.txt.
# brax.training 0.14.2 needs jax 0.7.x (it calls jax.device_put_replicated, removed in the
# jax 0.10 of the main .venv), hence a venv of its own.
# Idempotent: re-running only installs what is missing. Override the location with BRAX_VENV.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${BRAX_VENV:-$root/.venv-brax}"
req="$here/requirements-brax.txt"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "Creating $venv"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -r "$req"

JAX_PLATFORMS=cpu "$venv/bin/python" -W ignore -c "import jax, brax, mujoco; from mujoco import mjx; from brax.training.agents.ppo import train as _p; from brax.training.agents.sac import train as _s; print('brax ok: brax', brax.__version__, 'jax', jax.__version__, 'mujoco', mujoco.__version__, 'devices', jax.devices())"
