#!/usr/bin/env bash
# Run 126, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# the GPU tests of RELOAD_FROM_KEPT and FAST_ACTIVATIONS (the steep variants with the parked gate, the layer's
# activated call with both, the raw gate in bf16) and of the kernel callers whose signature took G_kept's stand-in,
# TEST_S seconds; then run126-layer.py (each variant compiled in its own process first; the defaults, the two
# switches and MIDDLES_BY_ROWS timed beside fla, LAYER_S seconds); the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-220} tests/test_gpu_level5.py tests/test_gpu_level3.py tests/test_gpu_backward.py -k "\
(steep_chunk_variants and kept) or (activations_in_chunk_intra and kept) or \
(chunk_intra_against_reference_stage and dtype1 and 200) or test_prepare_stage or test_chunk_intra_backward_outputs"
timeout -k 5 ${LAYER_S:-240} python results/tuning/run126-layer.py --warm 2>&1 | grep "^{\|Error\|warm" \
  | cut -c1-600
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
