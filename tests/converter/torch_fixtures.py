"""Shared helpers of the torch tests: the synthetic modules of ``fixtures/torch`` with their saved
weights, and an independent per-module recording of torch's own forward pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TORCH_DIR = ROOT / "fixtures" / "torch"
SB3_DIR = ROOT / "fixtures" / "sb3"
CARTPOLE = ROOT / "fixtures" / "real" / "sb3_ppo_cartpole.zip"


def modules_file(name: str = "modules.py"):
    """A Python file of ``fixtures/torch`` (default ``modules.py``), imported under a private name."""
    spec = importlib.util.spec_from_file_location(f"policyport_test_torch_{name.removesuffix('.py')}", TORCH_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_module(name: str):
    """``(module in eval mode with the fixture's weights, observation shape)``."""
    import torch

    make, shape = modules_file().MODULES[name]
    module = make()
    module.load_state_dict(torch.load(TORCH_DIR / f"{name}.state_dict.pt", weights_only=True))
    return module.eval(), shape


def observations(shape, batch: int, dtype=np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (batch, *shape)).astype(dtype)


def torch_leaf_outputs(module, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Module path -> output of every leaf module, from forward hooks registered here (not policyport's)."""
    import torch

    out: dict[str, np.ndarray] = {}
    hooks = [m.register_forward_hook(lambda _m, _i, o, path=path: out.__setitem__(path, o.detach().clone().numpy()))
             for path, m in module.named_modules() if path and not list(m.children())]
    try:
        with torch.no_grad():
            module(torch.as_tensor(obs))
    finally:
        for h in hooks:
            h.remove()
    return out
