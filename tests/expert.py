"""The MetaDrive expert's forward, computed in numpy from its weights: what interventions are checked against."""

from __future__ import annotations

import numpy as np


def expert_forward(weights, obs, h1=None, h2=None):
    """The MetaDrive expert's (fc_1/tanh, fc_2/tanh, logits) in float64, computed here from its RLlib
    weights (tanh hidden layers, ``fc_out`` linear), with either hidden activation replaced by a
    function of it: the independent forward that interventions are checked against."""
    p = "default_policy/"
    a1 = np.tanh(obs.astype(np.float64) @ weights[p + "fc_1/kernel"] + weights[p + "fc_1/bias"])
    a1 = a1 if h1 is None else h1(a1)
    a2 = np.tanh(a1 @ weights[p + "fc_2/kernel"] + weights[p + "fc_2/bias"])
    a2 = a2 if h2 is None else h2(a2)
    return a1, a2, a2 @ weights[p + "fc_out/kernel"] + weights[p + "fc_out/bias"]
