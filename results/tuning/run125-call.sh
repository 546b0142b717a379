#!/usr/bin/env bash
# Run 125, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# the 10 tests run 124's time cut (the op's steep variants by halvings; level 5's middles with halvings; two of level
# 3's) and MIDDLES_BY_ROWS's (its chunk_intra stage, the sigmoid form's activated call), TEST_S seconds;
# run124-layer.py (the halvings with a C-row operand and the middles by rows timed, beside fla); on an H200 then the
# stale records with what is left, else the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_level5.py -k "(chunk_kda_steep_chunk_variants and halvings) or \
(steep_chunk_variants and dtype1 and (middles_halvings or middles_by_rows or level3)) or \
(activations_in_chunk_intra and middles)"
timeout -k 5 ${LAYER_S:-150} python results/tuning/run124-layer.py 2>&1 | grep "^{\|Error" \
  | cut -c1-600
if nvidia-smi -L | grep -q H200; then rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
