#!/usr/bin/env bash
# Run 123, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# the split's GPU tests with the kernels reading grouped heads (test_op_takes_the_split, TEST_S seconds), then
# run123-steep.py (the grouped split timed; the layer's steep call option by option), then the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_cp.py -k "op_takes_the_split or split_fp16"
timeout -k 5 $(( ${TOTAL:-570} - $(date +%s) + start - 60 )) python results/tuning/run123-steep.py 2>&1 \
  | grep "^{\|Error" | cut -c1-600
timeout 50 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
