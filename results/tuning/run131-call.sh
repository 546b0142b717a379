#!/usr/bin/env bash
# Run 131, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds: the
# tests run 130 did not reach (level 3's bf16 stage and the op's bf16 cases with CAPPED_STEPS; four of run 128's),
# TEST_S seconds; run130-layer.py (CAPPED_STEPS against the defaults on the model's calls at the three level-5 shapes,
# fla beside) with what is left but 50 s; the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_level5.py -k "(capped and dtype1 and (level3 or chunk_kda_steep)) or \
(chunk_kda_steep_chunk_variants and dtype1 and safe_layer and chunk_kda and middles) or \
(l2norm_fused_in_chunk_intra and kda and dtype1 and packed) or (solve_by_halves and kda and dtype1 and logsigmoid and packed)"
left=$(( start + ${TOTAL:-570} - 50 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run130-layer.py --warm 2>&1 | grep "^{\|Error\|warm" | cut -c1-600
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
