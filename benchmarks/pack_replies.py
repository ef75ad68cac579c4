"""Pack an llm-relay folder's answers into one JSON file {key: reply} (the demo's replies.json).

python benchmarks/pack_replies.py benchmarks/replies/demo pgr_core/demo/replies.json
"""

import json
import sys
from pathlib import Path

source, out = Path(sys.argv[1]), Path(sys.argv[2])
replies = {
    p.stem: json.loads(p.read_text(encoding="utf-8"))["content"] for p in sorted((source / "answers").glob("*.json"))
}
out.write_text(json.dumps(replies, ensure_ascii=False, indent=0, sort_keys=True) + "\n", encoding="utf-8")
print(len(replies), "replies in", out)
