#!/usr/bin/env bash
# One round of the relay procedure (docs/relay.md): file the helpers' answers, run pgr eval against
# llm-relay, and split what is still pending into parts for the next helpers.
#
#   lab/relay_round.sh REPLIES WORK PARTS -- pgr eval ARGS...
#
# REPLIES: the relay folder kept in the project (lab/replies/<name>); llm-relay must be serving
# it (../shared/tools/llm-relay serve REPLIES 8090). WORK: a scratch folder: answers-*.json there are
# filed first, then the new parts are written as WORK/next/part-<i>.md. Stop when it says 0 pending.
set -euo pipefail
replies=$1 work=$2 parts=$3; shift 3
[ "${1:-}" = "--" ] && shift
tools=$(cd "$(dirname "$0")/../../shared/tools" 2>/dev/null && pwd || echo ../shared/tools)
shopt -s nullglob
for f in "$work"/answers-*.json; do
  python3 "$(dirname "$0")/relay_load.py" "$replies" "$f"
  mv "$f" "$f.filed"
done
rm -f "$replies"/pending/*.json
"$@"
n=$(ls "$replies"/pending 2>/dev/null | wc -l)
echo "pending: $n"
if [ "$n" -gt 0 ]; then
  rm -rf "$work/next"; mkdir -p "$work/next"
  python3 "$tools/relay-batch.py" dump "$replies" "$work/next/part.md" "$parts"
fi
