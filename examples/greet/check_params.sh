#!/bin/sh
# Pre guardrail: refuse to greet nobody. Reads the same params JSON on stdin as the body.
if grep -q '"name": *""' ; then
  echo "params.name is empty" >&2
  exit 1
fi
