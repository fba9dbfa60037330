"""Which CleanRL script a state_dict's keys come from, told from the keys alone (for
:mod:`~policyport.converter.sources.cleanrl`, and for the refusal of such a file given as another kind)."""

from __future__ import annotations

import re

#: The script each layout comes from, for messages and the model metadata.
SCRIPTS = {
    "ppo-continuous": "ppo_continuous_action.py", "ppo": "ppo.py", "dqn": "dqn.py", "c51": "c51.py",
    "td3": "td3_continuous_action.py", "ddpg": "ddpg_continuous_action.py", "sac": "sac_continuous_action.py",
    "dqn-jax": "dqn_jax.py", "c51-jax": "c51_jax.py", "td3-jax": "td3_continuous_action_jax.py",
    "ddpg-jax": "ddpg_continuous_action_jax.py",
}


def cleanrl_script_of(keys) -> str | None:
    """The CleanRL script whose network a state_dict's ``keys`` are unmistakably from, or ``None``
    (a ``dqn.py`` Q-network, ``network.<i>.*`` alone, is a plain ``nn.Sequential`` as much as CleanRL's).

    For the refusal of such a file given as another kind; told from the keys alone.
    """
    keys = set(keys)
    if "actor_logstd" in keys and any(k.startswith("actor_mean.") for k in keys):
        return SCRIPTS["ppo-continuous"]
    if any(re.match(r"^actor\.\d+\.weight$", k) for k in keys) and any(re.match(r"^critic\.\d+\.weight$", k) for k in keys):
        return SCRIPTS["ppo"]
    if "atoms" in keys and any(k.startswith("network.") for k in keys):
        return SCRIPTS["c51"]
    if {"fc_mu.weight", "action_scale", "action_bias"} <= keys:
        return "td3_continuous_action.py or ddpg_continuous_action.py"
    if {"fc_mean.weight", "fc_logstd.weight", "action_scale", "action_bias"} <= keys:
        return SCRIPTS["sac"]
    return None
