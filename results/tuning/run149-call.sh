#!/usr/bin/env bash
# Run 149 (prepared 2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: the GPU tests of the pass's register forms (test_pass_forms_same_bits) within TEST_S; run147-trace.py on
# them within TRACE_S; run149-gdn.py (the op through each, beside FlashQLA and fla's Triton GDN) within OP_S;
# run149-kda.py (KDA's state pass with U's slots swizzled, and test_kda_pass_forms_same_bits among the tests); then,
# with RECORDS=1 on an H200, the stale records with what is left (ask with needs_h200=True).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py \
  -k "pass_forms_same_bits or traced_pass or chain_scales_keys"
forms="default,whole_stores,p_in_registers,whole_stores p_in_registers,all_in_registers,chain_scales_keys"
timeout -k 5 ${TRACE_S:-120} python results/tuning/run147-trace.py --warm --forms "$forms" 2>&1 \
  | grep "^{\|Error\|error" | grep -v '"compiled"' | cut -c1-1500
timeout -k 5 ${OP_S:-170} python results/tuning/run149-gdn.py --warm 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"warm"' | cut -c1-400
timeout -k 5 ${KDA_S:-90} python results/tuning/run149-kda.py 2>&1 | grep "^{\|Error\|error" | cut -c1-400
if [ "${RECORDS:-0}" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
fi
echo "done after $(( $(date +%s) - start )) s"
