#!/usr/bin/env bash
# Run 100 (carry .gpu and .carry): where the backward's time goes, then levels 1-4's forward + backward
# against fla, then run 94's grid order of GDN's inverse, each within its share of TOTAL seconds; rows and
# profile tables in $OUT. STAGES picks among "profile levels grid" (default: all three).
set -u
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-570} - $(date +%s) + start )); }
stages=" ${STAGES:-profile levels grid} "
if [[ $stages == *" profile "* ]]; then
  timeout -k 5 "${PROFILE_S:-150}" python results/tuning/run100-profile.py 2>&1 | grep -v "^20" | grep "cuda_ms\|Error\|error" | tail -12
fi
if [[ $stages == *" levels "* ]]; then
  timeout -k 5 $(( ${LEVELS_S:-200} + 30 )) python results/tuning/run100-levels.py "${LEVELS_S:-200}" 2>&1 | grep -v "^20" | tail -24
fi
if [[ $stages == *" grid "* ]] && [ "$(left)" -gt 100 ]; then
  timeout -k 5 $(( $(left) - 45 )) python results/tuning/run94-gdn-inverse.py compile time 2>&1 | grep -v "^20" | tail -20
fi
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
