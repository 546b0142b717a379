#!/usr/bin/env bash
# Run 151 (prepared 2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: on an H200 the stale records whose path contains ONLY first (within REC_S), then run151-gdn.py (issue 15's
# cases with the register forms on, beside GATE_FREE_INVERSE and SINGLE_CHUNK_OUTPUT, FlashQLA and fla's Triton GDN)
# within OP_S, then run144-gdn.py (the single-chunk kernels of GDN and KDA on short sequences) with what is left.
set -u
source "$(dirname "$0")/device-env.sh"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ "${REC_S:-0}" -gt 0 ]; then
  TOTAL_ALL=${TOTAL:-560}; TOTAL=$(( $(date +%s) - start + REC_S )) rerecord_rest; TOTAL=$TOTAL_ALL
fi
left=$(( ${TOTAL:-560} - $(date +%s) + start - 10 ))
op=$(( left < ${OP_S:-300} ? left : ${OP_S:-300} ))
[ "$op" -gt 30 ] && timeout -k 5 $op python results/tuning/run151-gdn.py --warm 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"warm"' | cut -c1-400
left=$(( ${TOTAL:-560} - $(date +%s) + start - 10 ))
[ "$left" -gt 40 ] && timeout -k 5 $left python results/tuning/run144-gdn.py --warm 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"warm"' | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
