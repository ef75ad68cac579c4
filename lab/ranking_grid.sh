#!/usr/bin/env bash
# Replay the capable model's recorded replies under each candidate ranking, then choose
# by leave-one-user-out (lab/choose_louo.py). No LLM is called: these settings change no prompt.
#
#   lab/ranking_grid.sh DATA.jsonl OUTDIR [METHODS]
set -euo pipefail
data=$1 out=$2 methods=${3:-pgr-cot,pgr-tot}
mkdir -p "$out"
runs=()
run() {  # NAME SET...
  local name=$1; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  pgr eval jsonl --data "$data" --methods "$methods" --replies lab/replies/capable \
    --vector-cache .pgr-cache/vectors --json "$out/$name.json" "${sets[@]}" >/dev/null 2>&1
  runs+=(--run "$name=$out/$name.records.jsonl")
}
for s in 0.75 0.6 0.5 0.4 0.25; do run "shared-$s" ranking=shared query_share=$s; done
for s in 0.75 0.5 0.25; do run "llm-$s" ranking=llm query_share=$s; done
python lab/choose_louo.py --data "$data" --methods "$methods" "${runs[@]}" --json "$out/louo.json"
