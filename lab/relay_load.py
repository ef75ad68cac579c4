"""File a helper's answers {key: reply} into an llm-relay folder, never replacing one already filed.

    python lab/relay_load.py lab/replies/capable answers.json

Unlike ``relay-batch.py load``, an answer already filed is kept: later rounds' prompts were written
from it, so replacing it would orphan them (two helpers may answer the same request).
"""

import json
import sys
from pathlib import Path

root, source = Path(sys.argv[1]), Path(sys.argv[2])
answers = json.loads(source.read_text(encoding="utf-8"))
filed = kept = 0
(root / "answers").mkdir(parents=True, exist_ok=True)
for key, content in answers.items():
    if not isinstance(content, str):  # a JSON reply written as an object: file its JSON text
        content = json.dumps(content, ensure_ascii=False)
    target = root / "answers" / f"{key}.json"
    if target.exists():
        kept += 1
        continue
    target.write_text(json.dumps({"content": content}, ensure_ascii=False), encoding="utf-8")
    (root / "pending" / f"{key}.json").unlink(missing_ok=True)
    filed += 1
print(filed, "answers filed,", kept, "already answered (kept)")
