#!/usr/bin/env bash
# Run 142 (2026-12-06), one device call on an H200 (carry .gpu and .carry: run 141's caches and autotune choices;
# COMMIT: this tree's commit): the stale GPU records by rerecord within TOTAL seconds, phase 1 stopped at WARM.
set -u
source "$(dirname "$0")/device-env.sh"
rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
