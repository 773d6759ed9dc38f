#!/bin/sh
# Writes summary.json with the row count of each CSV in the workspace.
set -eu
cd "$PERAGO_WORKSPACE_DIR"
label=$(sed -n 's/.*"label": *"\([^"]*\)".*/\1/p')
{
  printf '{"label": "%s", "files": {' "${label:-features}"
  sep=""
  for f in $(find . -name '*.csv' | sort); do
    printf '%s"%s": %s' "$sep" "${f#./}" "$(wc -l < "$f" | tr -d ' ')"
    sep=", "
  done
  printf '}}\n'
} > summary.json
cat summary.json
