#!/usr/bin/env bash
# Run 135, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds: the
# GPU tests whose bf16 calls take the capped steps now that a gate given activated does (CAPPED_STEPS_FOR, run 134):
# levels 3 and 5 against their float64 references with steep gates (uniform to -20, runs of -20, KDA's style), the
# fused norm and the solve by halves; and GDN's compact inverse (chunk_gated_inverse(compact=True)), alone and in the
# op; TEST_S seconds; then on an H200 the stale records, else run135-inverse.py (the compact inverse timed, INVERSE_S
# seconds) and run135-options.py (the layer against fla's pieces, then issue 41's table of options) with what is left
# but 30 s; the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_level3.py tests/test_gpu_level5.py tests/test_gpu_scalar_gate.py -k \
"((gated_attention_kernels or prepare_stage or forward_against_token_recurrence or l2norm_fused_in_chunk_intra or \
solve_by_halves) and (runs_of_-20 or uniform_to_-20 or kda_style) and not scalar and not gdn) or compact"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
else
  timeout -k 5 ${INVERSE_S:-120} python results/tuning/run135-inverse.py --warm 2>&1 | grep "^{\|Error\|warm" \
    | cut -c1-600
  left=$(( start + ${TOTAL:-560} - 30 - $(date +%s) ))
  timeout -k 5 $left python results/tuning/run135-options.py --warm ${PARTS:---layer --options} 2>&1 \
    | grep "^{\|Error\|warm" | cut -c1-600
  timeout 25 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
fi
echo "done after $(( $(date +%s) - start )) s"
