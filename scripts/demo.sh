#!/usr/bin/env bash
# Set up .venv and run the README's tour on the bundled MetaDrive driving expert:
# convert -> inspect -> extract -> run on both backends recording every activation -> record a
# dataset and its statistics -> verify against the source -> export-numpy -> pack, and last the
# packed folder re-checks itself against its golden data with Python and numpy alone.
# Everything it writes goes to out/ (files of an earlier run are replaced).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh analysis
export PATH="$PWD/.venv/bin:$PATH"
SRC=fixtures/real/metadrive_ppo_expert.npz
mkdir -p out

echo "== convert: RLlib weights -> ONNX, checked against the source before writing"
policyport convert "$SRC" -o out/metadrive.onnx --activation tanh --head diag-gaussian --force

echo "== inspect"
policyport inspect out/metadrive.onnx

echo "== extract: initializers back to .npz under the source's names"
policyport extract out/metadrive.onnx -o out/metadrive_weights.npz --force
python - <<'PY'
import numpy as np
src, out = np.load("fixtures/real/metadrive_ppo_expert.npz"), np.load("out/metadrive_weights.npz")
same = [k for k in src.files if k in out.files and src[k].dtype == out[k].dtype and src[k].tobytes() == out[k].tobytes()]
print(f"weights round-trip: {len(same)}/{len(src.files)} arrays bit-identical, keys in order: {src.files == out.files}")
assert len(same) == len(src.files) and src.files == out.files
np.save("out/obs.npy", np.random.default_rng(0).uniform(0, 1, (1000, 275)).astype(np.float32))
print("wrote out/obs.npy: 1000 observations drawn uniformly from [0, 1)^275")
PY

for backend in numpy onnxruntime; do
  echo "== run on $backend, recording every activation"
  policyport run out/metadrive.onnx -i out/obs.npy -o "out/actions_$backend.npz" \
    --backend "$backend" --record "out/activations_$backend.npz" --force
done

echo "== record: a dataset's activations streamed to disk, then per-neuron statistics"
policyport record out/metadrive.onnx -i out/obs.npy -o out/rec.npz --force
policyport stats out/rec.npz -o out/stats.json --force

echo "== verify: numpy vs onnxruntime vs the source's own forward pass, tensor by tensor"
policyport verify out/metadrive.onnx -i out/obs.npy --source "$SRC"

echo "== export-numpy: one readable numpy module, checked bit for bit before it is written"
policyport export-numpy out/metadrive.onnx -o out/metadrive_policy.py --force

echo "== pack: a folder that runs with numpy alone, then re-check it against its golden data"
policyport pack out/metadrive.onnx -o out/metadrive_bundle --source "$SRC" --force
policyport verify out/metadrive_bundle
echo "== the folder checks itself with its own run.py (Python and numpy alone)"
python out/metadrive_bundle/run.py --verify
