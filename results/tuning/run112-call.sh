#!/usr/bin/env bash
# Run 112, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. the GPU tests of the inverse's scan cumsum, rewritten after run 111 (doubling steps in shared memory), alone and
#    in the op dense and packed, within TEST_S seconds;
# then run112-decode-host.py (the checked decode step's host time, by function, within 40 s);
# then on an H200 the stale records (rerecord_rest) with what is left; on another card, within what is left:
# 2. run110-gdn-inverse.py `compile time packed` on the variants default, halves (the new default), halves_scan and
#    halves_scan_heads_first (against FlashQLA's kkt_solve and forward), then packed GDN by both paths against one
#    sequence and FlashQLA (run 111 ran out of time before it);
# 3. run108-warmup.py at SHAPES (default 5,0,4: (1, 8192, 96) GDN, whose 96 blocks of the scalar-gate pass fill one
#    wave of 132 SMs to 73 %, so that 4 runs (3 waves of a quarter of the work) may pay; (1, 32768, 32); (1, 32768, 4))
#    split into PIECES (default 2,3,4,6) runs, and the op routed through the split (SPLIT_IN_OP) with the keys' check
#    now reduced as k is read.
set -u
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-570} - $(date +%s) + start )); }
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-120} python -m pytest \
  -o addopts="" -n 8 -m gpu -v -p no:cacheprovider tests/test_gpu_scalar_gate.py \
  -k "inverse_against_reference_stage or inverse_arrangement" 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " \
  | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-300 > "$OUT"/gpu-tests.txt
grep -c PASSED "$OUT"/gpu-tests.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests.txt | tail -12
timeout -k 5 40 python results/tuning/run112-decode-host.py 2>&1 | grep "decode host\"\|Error" | cut -c1-300
if nvidia-smi -L | grep -q H200; then rerecord_rest; echo "done after $(( $(date +%s) - start )) s"; exit; fi
RUN110_VARIANTS=default,halves,halves_scan,halves_scan_heads_first timeout -k 5 $(( $(left) * 45 / 100 )) \
  python results/tuning/run110-gdn-inverse.py compile time packed 2>&1 | grep "^{\|Error" | cut -c1-300
SHAPES=${SHAPES:-5,0,4} PIECES=${PIECES:-2,3,4,6} timeout -k 5 $(( $(left) - 40 )) python results/tuning/run108-warmup.py 2>&1 \
  | grep "^{\|Error" | cut -c1-300
timeout 30 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
