#!/usr/bin/env bash
# Every table of the cue evidence (docs/evidence.md, "Cues written by a capable model") from the
# recorded replies in lab/replies/capable: no model is called. The cue and question caches
# are rebuilt by replay under $OUT (default /tmp/pgr-capable-cues), never kept in the project (their
# keys are the data set's fact texts).
#
#   lab/capable_cues.sh [OUT]
set -euo pipefail
out=${1:-/tmp/pgr-capable-cues}
mkdir -p "$out"
R=lab/replies/capable
MQ=../shared/data/mq-lite/dev-facts.jsonl
C="--replies $R --vector-cache .pgr-cache/vectors --cue-cache $out/cues.sqlite3"
export MEM0_TELEMETRY=False
table() { sed -n '/^| method/,/^$/p'; }
echo "## MQ-lite dev facts: the question alone and the feedback round over capable-model cues"
pgr eval jsonl --data $MQ --methods query-only,pgr-feedback $C --json "$out/mq-plain.json" 2>/dev/null | table
pgr eval jsonl --data $MQ --cues --methods query-only,pgr-feedback,pgr-cot $C --json "$out/mq-cues.json" 2>/dev/null | table
echo "## Prior art at the same write cost, and pgr's cue-path choices (leave one user out)"
python lab/prior_art.py write --data $MQ --replies $R --cache "$out/questions.sqlite3"
python lab/prior_art.py write --writer zero-shot-cues --data $MQ --replies $R --cache "$out/zero-shot.sqlite3"
python lab/prior_art.py score --data $MQ --questions "$out/questions.sqlite3" --cues "$out/cues.sqlite3" \
  --zero-shot-cues "$out/zero-shot.sqlite3" --model "recorded:$R" --json "$out/prior-art.json" 2>/dev/null
echo "## LoCoMo conv-30 and PrefEval (pool 6, every 5th) over capable-model cues"
pgr eval locomo --data ../shared/data/locomo --user conv-30 --methods query-only,pgr-feedback $C \
  --json "$out/l30-plain.json" 2>/dev/null | table
pgr eval locomo --data ../shared/data/locomo --user conv-30 --cues --methods query-only,pgr-feedback $C \
  --json "$out/l30-cues.json" 2>/dev/null | table
P="--per-topic 5 --fillers 5 --filler-pool 6 --every 5"
pgr eval prefeval --data ../shared/data/prefeval $P --methods query-only,pgr-feedback $C \
  --json "$out/pref-plain.json" 2>/dev/null | table
pgr eval prefeval --data ../shared/data/prefeval $P --cues --methods query-only,pgr-feedback $C \
  --json "$out/pref-cues.json" 2>/dev/null | table
