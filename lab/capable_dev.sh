#!/usr/bin/env bash
# The capable-model tables of docs/evidence.md, replayed from the recorded replies (no LLM is called):
# MQ-lite dev facts and turns under pgr's defaults, the ranking grid with its leave-one-user-out choice,
# cot against tot, and what each phase adds.
#
#   lab/capable_dev.sh [OUTDIR]      (default lab/results/capable)
set -euo pipefail
out=${1:-lab/results/capable}
mkdir -p "$out"
export MEM0_TELEMETRY=False
C="--replies lab/replies/capable --vector-cache .pgr-cache/vectors"
M=query-only,pgr-none,pgr-feedback,pgr-cot,pgr-tot,query-fusion,hyde
# PAG answers were judged on facts (the answers on turns were not recorded)
pgr eval jsonl --data ../shared/data/mq-lite/dev-facts.jsonl --methods $M $C --json "$out/dev-facts.json" \
  --win-rate pgr-cot:query-only 2>/dev/null | sed -n '/^| method/,/^$/p;/win rate/p'
pgr eval jsonl --data ../shared/data/mq-lite/dev-turns.jsonl --methods $M $C --json "$out/dev-turns.json" \
  2>/dev/null | sed -n '/^| method/,/^$/p'
pgr eval locomo --data ../shared/data/locomo --every 39 --methods query-only,pgr-none,pgr-feedback,pgr-cot $C \
  --json "$out/locomo-e39.json" 2>/dev/null | sed -n '/^| method/,/^$/p'
pgr eval prefeval --data ../shared/data/prefeval --per-topic 5 --fillers 5 --filler-pool 6 --every 5 \
  --methods query-only,pgr-feedback,pgr-cot $C --json "$out/prefeval-pool6-e5.json" 2>/dev/null | sed -n '/^| method/,/^$/p'
echo "## cot against tot (leave-one-user-out), facts"
python lab/choose_louo.py --data ../shared/data/mq-lite/dev-facts.jsonl \
  --run cot="$out/dev-facts.records.jsonl@pgr-cot" --run tot="$out/dev-facts.records.jsonl@pgr-tot" 2>&1 | tail -6
echo "## no LLM: none against feedback (leave-one-user-out)"
for kind in facts turns; do
  python lab/choose_louo.py --data ../shared/data/mq-lite/dev-$kind.jsonl \
    --run none="$out/dev-$kind.records.jsonl@pgr-none" --run feedback="$out/dev-$kind.records.jsonl@pgr-feedback" 2>&1 | tail -2
done
echo "## ranking (leave-one-user-out), facts"
lab/ranking_grid.sh ../shared/data/mq-lite/dev-facts.jsonl "$out/grid-facts"
echo "## what each phase adds, facts"
python lab/phase_gains.py --data ../shared/data/mq-lite/dev-facts.jsonl --records "$out/dev-facts.records.jsonl"
