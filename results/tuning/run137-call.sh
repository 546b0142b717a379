#!/usr/bin/env bash
# Run 137 (prepared 2026-12-06), one device call (carry .gpu and .carry; COMMIT: the commit of this working tree),
# within TOTAL seconds: fp16's compact inverse (test_compact_inverse_in_fp16: bit for bit fp16's default arrangement,
# dense and packed; if it passes, COMPACT_DTYPES takes float16), then every test of tests/test_gpu_scalar_gate.py and
# tests/test_gpu_layer.py under this session's defaults (the compact inverse, the layer's kernels), TEST_S seconds;
# then on an H200 the stale records with what is left (rerecord_rest), else run137-safe.py (safe_gate's call by the
# capped steps against the middles, mild and a layer's gates) with what is left but 20 s.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-240} tests/test_gpu_scalar_gate.py tests/test_gpu_layer.py
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
else
  left=$(( start + ${TOTAL:-560} - 20 - $(date +%s) ))
  timeout -k 5 $left python results/tuning/run137-safe.py --warm 2>&1 | grep "^{\|Error\|warm" | cut -c1-600
fi
echo "done after $(( $(date +%s) - start )) s"
