#!/usr/bin/env bash
# Run 95 (carry .gpu and .carry; COMMIT: the commit of this working tree): run95-backward.py within
# TIME_S seconds, then the missing or stale GPU records of the backward chapter, then the other stale
# records within what is left of TOTAL seconds. Records and caches in $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-560} - $(date +%s) + start )); }
timeout -k 5 "${TIME_S:-110}" python results/tuning/run95-backward.py 2>&1 | grep "^{" | tail -20
for only in snippets/backward ""; do
  budget=$(( $(left) - 15 ))
  [ "$budget" -lt 60 ] && break
  echo "rerecord ${only:-everything stale}: ${budget} s"
  timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out $OUT --budget $budget --warm ${WARM:-120} \
    --commit "$COMMIT" ${only:+--only $only} 2>&1 | tee -a $OUT/rerecord.txt | grep -v "^20" | tail -25
done
echo "done after $(( $(date +%s) - start )) s"
