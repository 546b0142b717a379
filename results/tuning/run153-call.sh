#!/usr/bin/env bash
# Run 153 (prepared 2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: the GPU tests of WALK_IDENTITIES (the chunk stages against float64, the ops' gradients against the
# recurrence), of the traced inverse, PACKED_TILES, BETA_IN_ITS_DTYPE and GATE_FREE_IN_SPLIT (with the gate-free
# inverse's own tests under today's pass forms) within TEST_S, run154-inverse-trace.py (GDN's first kernel stage by
# stage), run155-tiles.py (short packed sequences in tiles, off and on), then
# run153-walk.py (forward + backward with the switch off and on, beside FlashQLA's GDN step and fla's KDA step)
# with what is left.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-240} tests/test_gpu_backward.py tests/test_gpu_scalar_gate.py tests/test_gpu_cp.py \
  -k "identities or walk_identities or traced_inverse or packed_tiles or beta_in_its_dtype or gate_free_inverse"
timeout -k 5 90 python results/tuning/run154-inverse-trace.py 2>&1 | grep "^{\|Error\|error" | cut -c1-900
timeout -k 5 120 python results/tuning/run155-tiles.py 2>&1 | grep "^{\|Error\|error" | grep -v '"stages"' | cut -c1-400
left=$(( ${TOTAL:-560} - $(date +%s) + start - 10 ))
[ "$left" -gt 40 ] && timeout -k 5 $left python results/tuning/run153-walk.py 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"stages"' | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
