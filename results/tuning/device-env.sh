# Sourced by the call scripts from run 91 on (carry .gpu and .carry): the offline bundle installed,
# the caches of earlier calls put back, the GPU named. Sets $start (seconds) for the callers' budgets.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
start=$(date +%s)
bash .gpu/install.sh /tmp/site > /tmp/install.txt 2>&1 || { cat /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
[ -d .carry ] && python -c "from kda.site.rerecord import unpack_caches; print('caches back:', unpack_caches('.carry'))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
# GPU tests within $1 seconds: pytest -n 8 over the rest of the arguments (files, then -k and the like), every test's
# verdict and the failures' lines to $OUT/gpu-tests.txt, the failures' messages to $OUT/gpu-failures.txt; the count
# and the failures printed.
gpu_tests() {
  local seconds=$1; shift
  KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 "$seconds" python -m pytest -o addopts="" \
    -n 8 -m gpu -v -p no:cacheprovider "$@" 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " \
    | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-300 > "$OUT"/gpu-tests.txt
  grep -c PASSED "$OUT"/gpu-tests.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests.txt | tail -12
}
# Record the stale snippets whose path contains $1 within $2 seconds, one at a time; the records so far to
# $OUT/records.tar.
record() {
  [ "$2" -lt 40 ] && { echo "$1: no time left"; return; }
  timeout -k 5 $(( $2 + 10 )) python -m kda.site run --gpu --stale --only "$1" --timeout "$2" --commit "$COMMIT" 2>&1 \
    | grep -v "^20" | tail -4
  python -c "import os, tarfile; t = tarfile.open(os.environ['OUT'] + '/records.tar', 'w'); t.add('results/gpu', arcname='.')"
}
# Record the snippets given after $1 one at a time, each within what is left of TOTAL less 40 s, at most $1 s.
record_each() {
  local cap=$1 snippet budget; shift
  for snippet in "$@"; do
    budget=$(( ${TOTAL:-575} - $(date +%s) + start - 40 )); [ "$budget" -gt "$cap" ] && budget=$cap
    record "$snippet" "$budget"
  done
}
# The stale GPU records (those whose path contains ONLY, where set) by rerecord within what is left of TOTAL
# seconds, phase 1 stopped at WARM seconds (60); its whole log to $OUT/rerecord.txt (the caches packed either way).
rerecord_rest() {
  local budget=$(( ${TOTAL:-575} - $(date +%s) + start - 15 ))
  if [ "$budget" -ge 100 ]; then
    timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out "$OUT" --budget "$budget" --warm ${WARM:-60} \
      --commit "$COMMIT" ${ONLY:+--only "$ONLY"} 2>&1 | grep -v "^20" | tee "$OUT"/rerecord.txt | tail -12
  else
    timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
  fi
}
# At most 8 files come back from $OUT: on exit, the logs, rows and profiles go into one logs.tgz beside the
# caches when there are more.
bundle_logs() {
  cd "$OUT" || return
  local logs; logs=$(ls | grep -v "^caches\|^autotune\|^records.tar$\|^logs.tgz$")
  [ "$(ls | wc -l)" -gt 8 ] && [ -n "$logs" ] && tar czf logs.tgz $logs && rm -f $logs
}
trap bundle_logs EXIT
