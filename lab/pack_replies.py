"""Write the demo's replies.json: the recorded replies its default run asks for, and no others.

    python lab/pack_replies.py [lab/replies/demo] [pgr_core/demo/replies.json]

Runs the bundled demo (MiniLM, the default strategy) against the llm-relay folder of the demo's
recorded replies and keeps exactly the ones it used; fails if any request has no reply.
"""

import json
import sys
from pathlib import Path

from pgr_core import PGR, demo
from pgr_core.models.embedders import MiniLMEmbedder
from pgr_core.models.recorded import RecordedLLM, request_key

source = Path(sys.argv[1] if len(sys.argv) > 1 else "lab/replies/demo")
out = Path(sys.argv[2] if len(sys.argv) > 2 else "pgr_core/demo/replies.json")
recorded = RecordedLLM.from_path(source)
used: dict[str, str] = {}


class Using(RecordedLLM):
    def complete(self, messages, *, schema=None, max_tokens=512, temperature=0.0):  # type: ignore[no-untyped-def]
        done = super().complete(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)
        used[request_key(messages, schema, max_tokens, temperature)] = done.text
        return done


items = demo.run_demo(PGR(demo.build_store(MiniLMEmbedder()), llm=Using(recorded.replies)))
if any(item.pgr.degraded for item in items):
    sys.exit("a demo request has no recorded reply: record it through llm-relay first (docs/relay.md)")
out.write_text(json.dumps(dict(sorted(used.items())), ensure_ascii=False, indent=0), encoding="utf-8")
print(len(used), "replies in", out)
