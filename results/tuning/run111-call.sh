#!/usr/bin/env bash
# Run 111, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. the GPU tests of what landed unverified: the warm-up split and the op's route (run 109's), the inverse's halves
#    and scan and chunk_intra's SOLVE_BY_HALVES (run 110's), speculative decoding's token slots (TOKEN_SLOTS), the
#    deferred decode checks (DEFERRED_CHECKS), the packed prefill in a CUDA graph (DEVICE_CHUNK_TABLES), in one pytest
#    within TEST_S seconds;
# 2. run110-gdn-inverse.py (the inverse's arrangements against FlashQLA's kkt_solve, the op, chunk_kda with
#    SOLVE_BY_HALVES) within TUNE_S seconds;
# 3. run111-decode.py (the decode step checked and waiting, checked and deferred, unchecked, fla) within DECODE_S;
# 4. run108-warmup.py at SHAPES (default 1: GDN and KDA at (1, 131072, 4)) within what is left less 20 s;
# then, on an H200, the stale records with RECORD_S seconds (rerecord_rest; the caches are packed either way).
# A stage whose seconds are 0 (WARMUP=0 for stage 4) is skipped: TUNE_S=0 DECODE_S=0 WARMUP=0 RECORD_S=400 gives the
# tests, then the records (on an H200; elsewhere the tuning stages with their defaults).
set -u
source "$(dirname "$0")/device-env.sh"
# records need an H200: on another card the tuning stages run in their place
if ! nvidia-smi -L | grep -q H200 && [ "${RECORD_S:-0}" -gt 0 ]; then
  RECORD_S=0; [ "${TUNE_S:-170}" = 0 ] && { TUNE_S=170; DECODE_S=60; WARMUP=1; }
fi
left() { echo $(( ${TOTAL:-560} - $(date +%s) + start )); }
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-150} python -m pytest \
  -o addopts="" -n 8 -m gpu -v -p no:cacheprovider tests/test_gpu_cp.py tests/test_gpu_scalar_gate.py \
  tests/test_gpu_level5.py tests/test_gpu_decode.py \
  -k "warmup or op_takes_the_split or inverse_against_reference_stage or inverse_arrangement or solve_by_halves \
or token_slots or deferred_checks or guarded_kernel or replays_in_a_cuda_graph" 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " \
  | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-300 > "$OUT"/gpu-tests.txt
grep -c PASSED "$OUT"/gpu-tests.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests.txt | tail -12
[ "${TUNE_S:-170}" -gt 0 ] && timeout -k 5 ${TUNE_S:-170} python results/tuning/run110-gdn-inverse.py compile time kda \
  packed 2>&1 | grep "^{\|Error" | cut -c1-400
[ "${DECODE_S:-60}" -gt 0 ] && timeout -k 5 ${DECODE_S:-60} python results/tuning/run111-decode.py 2>&1 \
  | grep "^{\|Error" | cut -c1-400
[ "${WARMUP:-1}" = 1 ] && SHAPES=${SHAPES:-1} timeout -k 5 $(( $(left) - ${RECORD_S:-0} - 20 )) \
  python results/tuning/run108-warmup.py 2>&1 | grep "^{\|Error" | cut -c1-400
if nvidia-smi -L | grep -q H200 && [ "${RECORD_S:-0}" -gt 0 ]; then TOTAL=$(( $(date +%s) - start + RECORD_S )) rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
