"""D4RL reference returns and normalized scores.

``normalized_score = 100 * (R - random) / (expert - random)``, with D4RL's constants for the
locomotion families (``d4rl/infos.py``) or the references a dataset carries in its metadata.
"""

from __future__ import annotations

import re

# D4RL's reference returns (d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE: a random policy and the
# SAC expert of each locomotion task); normalized score = 100 * (R - min) / (max - min).
D4RL_REF_RETURNS: dict[str, tuple[float, float]] = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
}


def d4rl_family(env_id: str | None) -> str | None:
    """The D4RL task family of a Gymnasium or D4RL id (``'Hopper-v5'`` -> ``'hopper'``), or None.

    JAX simulators (``brax:hopper``, ``jax:...``) have none: D4RL's references are returns of
    MuJoCo's Gym tasks, and Brax's versions of them pay other rewards and costs.
    """
    if not env_id or re.match(r"^(brax|jax):", env_id):
        return None
    name = env_id.split("/")[-1].split("?")[0].lower()
    head = re.split(r"[-_]", name)[0]
    return head if head in D4RL_REF_RETURNS else None


def reference_returns(env_id: str | None) -> tuple[float, float] | None:
    """D4RL ``(random, expert)`` reference returns for ``env_id``'s family, or None."""
    family = d4rl_family(env_id)
    return D4RL_REF_RETURNS[family] if family else None


def normalized_score(ret: float, ref: tuple[float, float] | None) -> float | None:
    """D4RL normalized score ``100 * (ret - min) / (max - min)``; None without references."""
    if ref is None:
        return None
    lo, hi = ref
    return 100.0 * (float(ret) - lo) / (hi - lo)
