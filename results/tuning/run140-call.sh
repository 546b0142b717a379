#!/usr/bin/env bash
# Run 140 (prepared 2026-12-06), one device call (carry .gpu; COMMIT: the commit of this working tree), within TOTAL
# seconds: run140-gdn.py (GDN's pass and inverse without the in-place loops' barriers, against the old kernels rebuilt
# from today's source, FlashQLA and fla's Triton GDN; GDN_S seconds), then the GPU tests of what changed with what is
# left but 20 s: tests/test_gpu_scalar_gate.py whole, and the backward's chunk-kernel and packed tests (their rows past
# a chunk's end are now zeroed by a plain store, not selected in place).
set -u
source "$(dirname "$0")/device-env.sh"
timeout -k 5 ${GDN_S:-220} python results/tuning/run140-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
left=$(( start + ${TOTAL:-560} - 20 - $(date +%s) ))
gpu_tests $left tests/test_gpu_scalar_gate.py tests/test_gpu_backward.py -k \
  "test_gpu_scalar_gate or chunk_kernel_against or chunk_kernel_without or packed_sequences"
echo "done after $(( $(date +%s) - start )) s"
