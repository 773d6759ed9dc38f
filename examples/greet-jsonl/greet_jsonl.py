"""A jsonl body: one JSON request per line on stdin, one JSON response per line on stdout."""

import json
import os
import sys

GREETING = os.environ.get("GREETING", "hello")

for line in sys.stdin:
    request = json.loads(line)
    if "cancel" in request:
        # body.soft_time_limit's wrap-up request; this body answers too fast to need it.
        continue
    params = request["params"]
    name = params["name"]
    if not name:
        reply = {"error": {"message": "params.name is empty", "terminal": True}}
    else:
        times = params.get("times", 1)
        reply = {"result": {"message": " ".join([f"{GREETING}, {name}!"] * times), "length": len(name)}}
    reply["execution_id"] = request["execution_id"]
    print(json.dumps(reply), flush=True)
