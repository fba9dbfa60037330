"""The environment's action bounds, as ``--action-bounds`` gives them to the sources whose player or
distribution maps the action to them (rl_games' ``clip_actions``, TorchRL's ``TanhNormal``)."""

from __future__ import annotations

import numpy as np

from ..errors import OptionError


def action_bounds(bounds, actions: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` from ``--action-bounds``, each widened to ``actions`` entries, float32.

    Raises:
        OptionError: a side of another width than 1 or ``actions``, non-finite bounds, low not below high.
    """
    low, high = (np.asarray(side, np.float64).reshape(-1) for side in bounds)
    out = []
    for side, name in ((low, "low"), (high, "high")):
        if side.size not in (1, actions):
            raise OptionError(f"--action-bounds gives {side.size} {name} bounds; {what} has {actions} actions: give one "
                              f"number for all of them or {actions}")
        out.append(np.broadcast_to(side, (actions,)).astype(np.float32))
    low, high = out
    if not (np.isfinite(low).all() and np.isfinite(high).all()) or (low >= high).any():
        raise OptionError(f"--action-bounds: every low must be finite and below its high (low {low.tolist()}, "
                          f"high {high.tolist()})")
    return low, high


def shown(values: np.ndarray) -> str:
    """One number when every entry is the same, else the list: ``-1`` or ``[-1, -2]``."""
    values = np.asarray(values)
    return f"{values[0]:g}" if (values == values[0]).all() else "[" + ", ".join(f"{v:g}" for v in values) + "]"
