#!/usr/bin/env bash
# Run 102 (carry .gpu and .carry; COMMIT: the commit of this working tree): the records staled by the four
# backward switches that went on after run 100 (backward/latency, gpu_error, training), one at a time, then
# the older stale records by rerecord with what is left. Records, logs and caches to $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-575} - $(date +%s) + start )); }
for snippet in ${RECORDS:-snippets/backward/latency snippets/backward/gpu_error snippets/backward/training}; do
  budget=$(( $(left) - 60 )); [ "$budget" -gt 220 ] && budget=220
  record "$snippet" "$budget"
done
rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
