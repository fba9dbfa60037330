#!/usr/bin/env bash
# Set up .venv and run the main job on the bundled MetaDrive driving expert:
# convert -> extract -> run on both backends recording every activation -> verify.
# Everything it writes goes to out/ (replaced on each run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cli
export PATH="$PWD/.venv/bin:$PATH"
SRC=fixtures/real/metadrive_ppo_expert.npz
mkdir -p out

echo "== convert: RLlib weights -> ONNX, checked against the source before writing"
policyport convert "$SRC" -o out/metadrive.onnx --head diag-gaussian --force

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
print("wrote out/obs.npy: 1000 observations drawn uniformly from [0, 1]^275")
PY

for backend in numpy onnxruntime; do
  echo "== run on $backend, recording every activation"
  policyport run out/metadrive.onnx -i out/obs.npy -o "out/actions_$backend.npz" \
    --backend "$backend" --record "out/activations_$backend.npz" --force
done

echo "== verify: numpy vs onnxruntime vs the source's own forward pass, tensor by tensor"
policyport verify out/metadrive.onnx -i out/obs.npy --source "$SRC"

echo "== pack: a folder that runs with numpy alone, then re-check it against its golden data"
policyport pack out/metadrive.onnx -o out/metadrive_bundle --source "$SRC" --force
policyport verify out/metadrive_bundle
echo "== the folder checks itself with its own run.py (Python and numpy alone)"
python out/metadrive_bundle/run.py --verify

echo "== export-numpy: one readable numpy module, checked bit for bit before it is written"
policyport export-numpy out/metadrive.onnx -o out/metadrive_policy.py --force
