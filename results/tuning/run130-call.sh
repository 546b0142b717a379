#!/usr/bin/env bash
# Run 130, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# the fp16 fix's tests and the 5 run 127 did not reach (run 128's list), with CAPPED_STEPS' tests (the chunk_intra
# stage at levels 3 and 5 on every steep gate and fp16's refusal, the op's, the layer's activated call in both forms,
# dense and packed), TEST_S seconds; run130-layer.py (CAPPED_STEPS against the defaults, the model's calls at the three
# shapes beside fla; SHAPES_N: the first few) with what is left but 50 s; the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_level5.py -k "(activations_in_chunk_intra and dtype0 and fast) or \
(activations_in_chunk_intra and dtype1 and sigmoid and packed and activated) or \
(chunk_kda_steep_chunk_variants and dtype1 and safe_layer and chunk_kda and middles) or \
(l2norm_fused_in_chunk_intra and kda and dtype1 and packed) or (solve_by_halves and kda and dtype1 and logsigmoid and packed) \
or capped"
left=$(( start + ${TOTAL:-570} - 50 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run130-layer.py --warm 2>&1 | grep "^{\|Error\|warm" | cut -c1-600
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
