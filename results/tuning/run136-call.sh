#!/usr/bin/env bash
# Run 136, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds: the
# GPU tests of the layer's own kernels (tests/test_gpu_layer.py: the causal convolution and the gated norm against
# float64, the layer with them against the layer by torch), TEST_S seconds; then run136-layer.py (the layer with and
# without them beside fla's pieces) with what is left but 20 s.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_layer.py
left=$(( start + ${TOTAL:-400} - 20 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run136-layer.py 2>&1 | grep "^{\|Error" | cut -c1-600
echo "done after $(( $(date +%s) - start )) s"
