#!/usr/bin/env bash
# The GPU benchmarks in one go, on a CUDA machine whose python3 has torch (and transformers
# for the VLA). With a folder of wheels (WHEELS=<dir>) the project's pure-Python
# dependencies are installed from it without a network; the project itself is used from
# this checkout. Results go to RESULTS (default benchmarks/results).
#
#   WHEELS=wheels RESULTS=/tmp/gpu bash benchmarks/gpu_benchmarks.sh
set -u
RESULTS=${RESULTS:-benchmarks/results}
mkdir -p "$RESULTS"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/rlinf-site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/rlinf-site${PYTHONPATH:+:$PYTHONPATH}
fi
# the package layout of pyproject.toml (robots/, sims/, policies/, ... import as rlinf_user.*)
pkg=/tmp/rlinf-pkg
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r rlinf_user "$pkg"/
for d in robots sims policies calibration configs; do ln -sfn "$PWD/$d" "$pkg/rlinf_user/$d"; done
export PYTHONPATH=$pkg:$PWD/benchmarks:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
echo "== image-SAC learner"
timeout 420 python3 benchmarks/bench_image_learner.py --device cuda --rows 4096 --updates 30 --repeats 5 \
  --out "$RESULTS/image_learner_gpu.json"
echo "== VLA chunk latency, small"
timeout 90 python3 benchmarks/bench_vla.py --sizes small --batches 1 8 32 --repeats 10 --uncached-batches 1 \
  --device cuda --dtype bfloat16 --out "$RESULTS/vla_small_gpu.json"
echo "== VLA chunk latency, pi0 (3.3B, random weights)"
timeout 240 python3 benchmarks/bench_vla.py --sizes pi0 --batches 1 8 32 --repeats 10 --uncached-batches 1 \
  --device cuda --dtype bfloat16 --out "$RESULTS/vla_pi0_gpu.json"
echo "== done"
