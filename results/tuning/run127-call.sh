#!/usr/bin/env bash
# Run 127, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree): the GPU tests of the
# defaults that run 126 turned on (RELOAD_FROM_KEPT, FAST_ACTIVATIONS for bf16, MIDDLES_BY_ROWS) on KDA's forward
# (bf16: dense and packed, steep gates, the layer's activated call) and the fp16 activated call with its raw gate in
# fp16, TEST_S seconds; run127-fp16.py (fp16's failure of run 126 taken apart), FP16_S seconds; run127-layer.py (the
# model's calls at the three level-5 shapes beside fla), LAYER_S seconds; the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_level5.py -k "\
(forward_against_token_recurrence and dtype1 and kda) or (packed and dtype1 and kda) or \
(activations_in_chunk_intra and ((dtype1 and activated) or (dtype0 and fast))) or \
(chunk_kda_steep_chunk_variants and dtype1 and chunk_kda and (halvings or middles))"
timeout -k 5 ${FP16_S:-100} python results/tuning/run127-fp16.py 2>&1 | grep "^{\|Error" | cut -c1-400
timeout -k 5 ${LAYER_S:-200} python results/tuning/run127-layer.py --warm 2>&1 | grep "^{\|Error\|warm" \
  | cut -c1-600
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
