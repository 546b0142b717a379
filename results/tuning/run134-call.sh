#!/usr/bin/env bash
# Run 134, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds: the
# GPU tests that call chunk_kda as a layer does without setting the switches (now with CAPPED_STEPS on for the softplus
# gate by default: decode's activation and layer tests, the training step in a layer, the layer under torch.compile,
# the norm kernel's), TEST_S seconds; then run134-given.py (the capped steps for gates given activated) with what is
# left but 30 s; the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_decode.py tests/test_gpu_backward.py tests/test_gpu_compile.py \
  tests/test_gpu_level5.py -k "speculative_decoding_token_slots or activations_in_the_kernel or \
layer_prefill_then_decode_on_the_gpu or chunk_kda_activations_on_the_gpu or a_training_step_in_a_layer or \
test_layer_prefill_and_decode_compiles_fullgraph or norm_kernel_is_torchs_norm"
left=$(( start + ${TOTAL:-560} - 30 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run134-given.py --warm 2>&1 | grep "^{\|Error\|warm" | cut -c1-600
timeout 25 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
