"""Reads params JSON on stdin, writes the result JSON on stdout."""

import json
import os
import sys

params = json.load(sys.stdin)
name = params["name"]
times = params.get("times", 1)
greeting = os.environ.get("GREETING", "hello")
print(f"greeting {name} {times} time(s) as {os.environ.get('PERAGO_WORKER_ID', '?')}", file=sys.stderr)
json.dump({"message": " ".join([f"{greeting}, {name}!"] * times), "length": len(name)}, sys.stdout)
