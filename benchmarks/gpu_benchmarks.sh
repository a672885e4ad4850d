#!/usr/bin/env bash
# The GPU benchmarks in one go, each today's path beside the fast one in the same process,
# on a CUDA machine whose python3 has torch, transformers, peft and safetensors. With a
# folder of wheels (WHEELS=<dir>, made by benchmarks/gpu_carry.sh) the project's other
# pure-Python dependencies are installed from it without a network; LM=<dir> (SmolLM2's
# config and tokenizer) lets lite_vla and token_vla run with random weights of its shape.
# The project itself is used from this checkout. Results go to RESULTS.
#
#   bash benchmarks/gpu_carry.sh    # here, then on the GPU machine:
#   WHEELS=.gpu-carry/wheels LM=.gpu-carry/smollm2 RESULTS=/tmp/gpu bash benchmarks/gpu_benchmarks.sh
#
# QUICK=1 runs every step at toy sizes (tiny/small models, few repeats) on whatever device
# there is: the check that the script runs before a GPU's minutes are spent on it.
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
PY=${PY:-python3}
DEV=cuda
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then DEV=cpu; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
LMARGS=()
if [ -n "${LM:-}" ]; then LMARGS=(--lm "$LM" --random-lm); fi
if [ -n "${QUICK:-}" ]; then
  CHUNK=(tiny) BIG=(small) LEARN=(lite token) LB=(2) R=2 IMG=(--rows 512 --updates 3 --repeats 2 --size 64 --cases cnn_scratch,resnet10_frame_features)
else
  CHUNK=(small) BIG=(pi0) LEARN=(small lite token) LB=(32) R=10 IMG=(--rows 4096 --updates 30 --repeats 3 --cases cnn_scratch,resnet10_frozen_frames,resnet10_frame_features,efficientnet_finetuned)
fi
# a GPU's utilisation, sampled beside the whole run
if [ "$DEV" = cuda ]; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 500 >"$RESULTS/gpu_utilisation.csv" 2>/dev/null &
  SMI=$!
fi
DT=bfloat16
GRAPH=--update-graph
[ "$DEV" = cpu ] && DT=float32 && GRAPH=""  # a captured update needs a GPU
echo "== VLA chunk latency: eager and CUDA graph, ${CHUNK[*]}"
timeout 60 $PY benchmarks/bench_vla.py --sizes "${CHUNK[@]}" --batches 1 8 32 --repeats $R --uncached-batches --graph \
  --device $DEV --dtype $DT --out "$RESULTS/vla_chunk_graph_small.json"
echo "== VLA chunk latency: eager and CUDA graph, ${BIG[*]} (random weights)"
timeout 100 $PY benchmarks/bench_vla.py --sizes "${BIG[@]}" --batches 1 8 --repeats $R --uncached-batches --graph \
  --device $DEV --dtype $DT --out "$RESULTS/vla_chunk_graph_pi0.json"
echo "== VLA learners: ${BIG[*]} (expert, lora) at batch 32"
timeout 120 $PY benchmarks/bench_vla_learner.py --models "${BIG[@]}" --batches "${LB[-1]}" --repeats 3 --autocast \
  --device $DEV --out "$RESULTS/vla_learner_pi0.json"
echo "== VLA learners: ${LEARN[*]}"
timeout 60 $PY benchmarks/bench_vla_learner.py --models "${LEARN[@]}" --finetune expert lora --batches "${LB[@]}" --repeats 3 --autocast \
  --device $DEV "${LMARGS[@]}" --out "$RESULTS/vla_learner_small.json"
echo "== image-SAC learner"
timeout 90 $PY benchmarks/bench_image_learner.py --device $DEV "${IMG[@]}" $GRAPH --out "$RESULTS/image_learner_gpu_run.json"
[ -n "${SMI:-}" ] && kill "$SMI" 2>/dev/null
echo "== done"
