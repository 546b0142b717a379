#!/usr/bin/env bash
# Run 124, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# the GPU tests of the halvings with a C-row operand (chunk_intra's steep variants by halvings, level 3 and 5; the
# op's; the activations compiled for steep chunks), TEST_S seconds; then run124-layer.py; then the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_level5.py -k "(steep_chunk_variants and halvings) or (activations_in_chunk_intra and activated)"
timeout -k 5 $(( ${TOTAL:-570} - $(date +%s) + start - 45 )) python results/tuning/run124-layer.py 2>&1 \
  | grep "^{\|Error" | cut -c1-600
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
