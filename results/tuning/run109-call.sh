#!/usr/bin/env bash
# Run 109 (carry .gpu and .carry; COMMIT: the commit of this working tree): the warm-up split after run 108, with
# the window launched at once and checked on the device behind the passes: its 15 GPU tests (two of them fixed
# after run 108) and the op's route (SPLIT_IN_OP, 2), then run108-warmup.py (the op routed too) at the shapes of
# SHAPES (default: GDN and KDA at (1, 32768, 32) and
# (1, 131072, 4)), within TOTAL seconds.
set -u
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-220} - $(date +%s) + start )); }
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-100} python -m pytest \
  -o addopts="" -n 8 -m gpu -v -p no:cacheprovider tests/test_gpu_cp.py -k "warmup or op_takes_the_split" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' \
  | cut -c1-300 > "$OUT"/gpu-tests-warmup.txt
grep -c PASSED "$OUT"/gpu-tests-warmup.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-warmup.txt | tail -8
SHAPES=${SHAPES:-0,1} timeout -k 5 $(( $(left) - 10 )) python results/tuning/run108-warmup.py 2>&1 | grep "^{\|Error" \
  | python -c "import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line); r['window'] = sorted(set(r.get('window', []))); print(json.dumps(r))
    except ValueError:
        print(line.rstrip())"
echo "done after $(( $(date +%s) - start )) s"
