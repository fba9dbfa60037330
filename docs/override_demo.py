"""Draws docs/override_demo.png: the MetaDrive expert's action with and without the override sets of
docs/metadrive_steer.json, on the 1,000 observations scripts/demo.sh uses (uniform in [0, 1)^275, seed 0).

The five neurons of ``fc_2/tanh`` in the sets are those with the largest weights onto the throttle half
of the action (``fc_out/kernel[:, 1]``: -0.146, -0.132, -0.132 for 236, 119, 34; +0.126, +0.117 for 3, 7);
"brake" drives each to the end of its range that lowers the throttle, "accelerate" to the other.

    python docs/override_demo.py      # needs the analysis extra (matplotlib)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

import policyport as pp
from policyport.runtime.overrides import load_override_sets

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

session = pp.load(pp.convert(str(ROOT / "fixtures/real/metadrive_ppo_expert.npz"), activation="tanh",
                             head="diag-gaussian"))
obs = np.random.default_rng(0).uniform(0, 1, (1000, 275)).astype(np.float32)
sets = load_override_sets(HERE / "metadrive_steer.json")
actions = {"no override": session.run(obs)["action"]}
actions.update({f"--steer {name}": session.run(obs, overrides=edits)["action"] for name, edits in sets.items()})

fig = Figure(figsize=(9, 3.4), dpi=110, layout="constrained")
colours = {"no override": "#4C72B0", "--steer brake": "#C44E52", "--steer accelerate": "#55A868"}
for i, (axis, label) in enumerate([(0, "steering (action[0])"), (1, "throttle / brake (action[1])")]):
    ax = fig.add_subplot(1, 2, i + 1)
    bins = np.linspace(-4, 4, 41)
    for name, a in actions.items():
        ax.hist(a[:, axis], bins=bins, histtype="step", linewidth=1.6, color=colours[name],
                label=f"{name}: mean {a[:, axis].mean():+.2f}")
    ax.set_xlabel(label)
    ax.set_ylabel("observations")
    ax.legend(fontsize=7.5, loc="upper left")
fig.suptitle("MetaDrive expert, 1,000 observations: five fc_2/tanh neurons overridden", fontsize=10)
fig.savefig(HERE / "override_demo.png")
for name, a in actions.items():
    print(f"{name:20s} mean action {a.mean(0).round(3)}")
