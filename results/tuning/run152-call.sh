#!/usr/bin/env bash
# Run 152 (prepared 2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: the GPU tests of the lean split (the window pass from first_chunk over the runs where they lie, G made in
# the runs' layout by the inverse, beta read in its dtype) within TEST_S; run151-host.py (the op's host time beside
# do_bench); run151-gdn.py on the dense and grouped cases, the default and the gate-free inverse, with what is left.
set -u
source "$(dirname "$0")/device-env.sh"
K="pass_from_a_later or pass_against_reference or state_flags or grouped_value_heads or values_out_of_range"
K="$K or packed_sequences or split_forward or inverse_against_reference or traced_pass"
K="$K or (forward_against_token and runs_of_-20) or warmup_starts or op_takes_the_split"
gpu_tests ${TEST_S:-240} tests/test_gpu_scalar_gate.py tests/test_gpu_cp.py -k "$K"
timeout -k 5 90 python results/tuning/run151-host.py 2>&1 | grep "^{\|Error\|error" | cut -c1-700
left=$(( ${TOTAL:-560} - $(date +%s) + start - 10 ))
[ "$left" -gt 40 ] && CASES=dense,grouped VARIANTS=default,gate_free_inverse timeout -k 5 $left \
  python results/tuning/run151-gdn.py 2>&1 | grep "^{\|Error\|error" | grep -v '"warm"\|"stages"' | cut -c1-300
echo "done after $(( $(date +%s) - start )) s"
