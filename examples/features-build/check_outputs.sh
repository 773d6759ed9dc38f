#!/bin/sh
# Post guardrail: the body must have written a summary. A non-zero exit fails the task (FAILED).
test -s "$PERAGO_WORKSPACE_DIR/summary.json" || { echo "summary.json is missing" >&2; exit 1; }
