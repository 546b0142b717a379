#!/usr/bin/env bash
# Run 141 (prepared 2026-12-06), one device call (carry .gpu; COMMIT: the commit of this working tree), within TOTAL
# seconds: run141-gdn.py (the pass with V_new out before V' is made over it, against the old kernels, GDN_S seconds),
# then tests/test_gpu_scalar_gate.py but its inverse tests (the inverse's passed in run 140) with what is left but 15 s.
set -u
source "$(dirname "$0")/device-env.sh"
timeout -k 5 ${GDN_S:-170} python results/tuning/run141-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
left=$(( start + ${TOTAL:-350} - 15 - $(date +%s) ))
gpu_tests $left tests/test_gpu_scalar_gate.py -k "not inverse"
echo "done after $(( $(date +%s) - start )) s"
