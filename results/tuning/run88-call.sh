#!/usr/bin/env bash
# One device call (run 88; carry .gpu, results/tuning and .carry): install the offline bundle, optionally run GPU tests (TESTS="files"), then
# re-record the stale GPU snippets within BUDGET seconds. COMMIT must be given (the commit that
# holds this working tree). Caches from an earlier call are read from .carry if present.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NO_MKDOCS_2_WARNING=1 FLA_FLASH_QLA=0   # the GDN snippets time fla's own Triton kernels
start=$(date +%s)
bash .gpu/install.sh /tmp/site > /tmp/install.txt 2>&1 || { cat /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_S:-200}" python -m pytest -o addopts="" -n 14 -m gpu -q -p no:cacheprovider $TESTS 2>&1 | tee $OUT/gpu-tests.txt | tail -15
fi
used=$(( $(date +%s) - start ))
budget=$(( ${TOTAL:-570} - used ))
echo "rerecord budget ${budget} s after ${used} s"
carry=""; [ -d .carry ] && carry="--carry .carry"
timeout $(( budget + 20 )) python -m kda.site rerecord --out $OUT --budget $budget --warm ${WARM:-150} \
  --commit "$COMMIT" $carry ${ONLY:+--only $ONLY} 2>&1 | tee $OUT/rerecord.txt | tail -40
python -m kda.site status | tail -20
