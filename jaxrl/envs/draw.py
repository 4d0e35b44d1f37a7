"""Pictures of the classic pure-JAX envs drawn from their state with numpy (no OpenGL).

``draw(core, state, width, height)`` returns one ``[height, width, 3]`` uint8 frame: the
pendulum's rod, the cart-pole's cart and pole on its track, the point mass in its arena. Shapes
are anti-aliased by their distance to each pixel.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from jaxrl.envs.classic import CartPoleSwingUp, Pendulum, PointMass
from jaxrl.errors import EnvError

_BACKGROUND = (255, 255, 255)
_DARK = (40, 40, 40)
_ROD = (204, 77, 77)
_CART = (77, 110, 204)
_TRACK = (150, 150, 150)
_TARGET = (90, 180, 90)


@functools.cache
def _pixel_centres(width: int, height: int) -> np.ndarray:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([xs + 0.5, ys + 0.5], -1)


class _Canvas:
    """A white image with a world frame: ``scale`` pixels per unit, origin at ``centre``."""

    def __init__(self, width: int, height: int, half_extent: float, centre_y: float = 0.5):
        self.img = np.empty((height, width, 3), np.float32)
        self.img[...] = _BACKGROUND
        self.scale = 0.5 * min(width, height) / half_extent
        self.origin = np.array([0.5 * width, centre_y * height], np.float32)
        self.pixels = _pixel_centres(width, height)

    def to_pixels(self, x: float, y: float) -> np.ndarray:
        """World ``(x, y)`` (y up) in pixel coordinates (y down)."""
        return self.origin + self.scale * np.array([x, -y], np.float32)

    def _paint(self, distance: np.ndarray, color: tuple[int, int, int]) -> None:
        alpha = np.clip(0.5 - distance, 0.0, 1.0)[..., None]  # a one-pixel anti-aliased edge
        self.img += alpha * (np.asarray(color, np.float32) - self.img)

    def segment(self, a: tuple, b: tuple, width: float, color: tuple[int, int, int]) -> None:
        """A rod of ``width`` (world units) from ``a`` to ``b``, with round ends."""
        p, q = self.to_pixels(*a), self.to_pixels(*b)
        d = q - p
        t = np.clip(((self.pixels - p) @ d) / max(float(d @ d), 1e-9), 0.0, 1.0)
        dist = np.linalg.norm(self.pixels - (p + t[..., None] * d), axis=-1)
        self._paint(dist - 0.5 * width * self.scale, color)

    def disc(self, c: tuple, radius: float, color: tuple[int, int, int]) -> None:
        """A filled disc of ``radius`` (world units) at ``c``."""
        dist = np.linalg.norm(self.pixels - self.to_pixels(*c), axis=-1)
        self._paint(dist - radius * self.scale, color)

    def box(self, c: tuple, half: tuple, color: tuple[int, int, int], line: float = 0.0) -> None:
        """A filled box (or its outline, ``line`` wide) at ``c`` with half sizes ``half``."""
        rel = np.abs(self.pixels - self.to_pixels(*c)) - self.scale * np.asarray(half, np.float32)
        outside = np.linalg.norm(np.maximum(rel, 0.0), axis=-1) + np.minimum(rel.max(-1), 0.0)
        self._paint(np.abs(outside) - 0.5 * line * self.scale if line else outside, color)

    def image(self) -> np.ndarray:
        """The picture as uint8."""
        return np.clip(np.rint(self.img), 0, 255).astype(np.uint8)


def _pendulum(env: Pendulum, state: np.ndarray, width: int, height: int) -> np.ndarray:
    th = float(state[0])  # 0 is upright
    c = _Canvas(width, height, 1.25 * env.l)
    c.segment((0.0, 0.0), (env.l * np.sin(th), env.l * np.cos(th)), 0.2 * env.l, _ROD)
    c.disc((0.0, 0.0), 0.05 * env.l, _DARK)
    return c.image()


def _cartpole(env: CartPoleSwingUp, state: np.ndarray, width: int, height: int) -> np.ndarray:
    x, th = float(state[0]), float(state[1])  # th = 0 upright, positive towards +x
    pole = 2.0 * env.half_length
    c = _Canvas(width, height, env.track_limit + 0.4, centre_y=0.6)
    c.segment((-env.track_limit - 0.2, 0.0), (env.track_limit + 0.2, 0.0), 0.03, _TRACK)
    c.box((x, 0.0), (0.25, 0.12), _CART)
    c.segment((x, 0.0), (x + pole * np.sin(th), pole * np.cos(th)), 0.06, _ROD)
    c.disc((x, 0.0), 0.04, _DARK)
    return c.image()


def _point_mass(env: PointMass, state: np.ndarray, width: int, height: int) -> np.ndarray:
    c = _Canvas(width, height, 1.1 * env.arena)
    c.box((0.0, 0.0), (env.arena, env.arena), _TRACK, line=0.02 * env.arena)
    c.disc((0.0, 0.0), 0.05 * env.arena, _TARGET)
    c.disc((float(state[0]), float(state[1])), 0.07 * env.arena, _CART)
    return c.image()


_DRAWERS = {Pendulum: _pendulum, CartPoleSwingUp: _cartpole, PointMass: _point_mass}


def draw(core: Any, state: Any, width: int, height: int) -> np.ndarray:
    """The ``[height, width, 3]`` uint8 picture of a classic env ``core`` in ``state``.

    Raises:
        EnvError: ``core`` is not one of the classic envs.
    """
    drawer = _DRAWERS.get(type(core))
    if drawer is None:
        raise EnvError(
            f"jaxrl cannot draw {type(core).__name__}: videos of jax: envs exist for "
            f"{', '.join(sorted(cls.name for cls in _DRAWERS))}."
        )
    return drawer(core, np.asarray(state, np.float64), width, height)


__all__ = ["draw"]
