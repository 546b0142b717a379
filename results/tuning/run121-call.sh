#!/usr/bin/env bash
# Run 121, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. the GPU tests of what landed unverified in the session of runs 113-120, within TEST_S seconds: the split of
#    grouped value heads (SPLIT_GROUPED_VALUES), a layer's call compiled for steep chunks (STEEP_FOR_ACTIVATED_GATES),
#    the backward's switch test as edited (the products alone, the halvings now on by default), and the backward's
#    gradient tests under the new default (PAIR_SUMS_BY_HALVINGS, blocks of one row);
# 2. on an H200 the stale records (rerecord_rest) with what is left; on another card run121-gva-layer.py (the two
#    switches timed), then the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
SELECT="op_takes_the_split or activations_in_chunk_intra or (switches_landed_off and (products or halvings or \
all_landed)) or gradients_against_token_recurrence or gradients_with_every_kernel"
gpu_tests ${TEST_S:-240} tests/test_gpu_cp.py tests/test_gpu_level5.py tests/test_gpu_backward.py -k "$SELECT"
if nvidia-smi -L | grep -q H200; then rerecord_rest; echo "done after $(( $(date +%s) - start )) s"; exit; fi
timeout -k 5 $(( ${TOTAL:-570} - $(date +%s) + start - 45 )) python results/tuning/run121-gva-layer.py 2>&1 \
  | grep "^{\|Error" | cut -c1-300
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
