"""`python -m perago_body schema MODULE:FUNCTION --out DIR [--check]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from ._schema import SchemaError, load, stale, write


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perago_body",
        description="Tools for perago task bodies written with perago_body.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    schema = commands.add_parser(
        "schema",
        help="write the JSON Schemas of a task's params and result",
        description="Writes DIR/params.json and DIR/result.json from the task's Pydantic models, "
        "for the manifest's params_schema and result_schema.",
    )
    schema.add_argument("target", metavar="MODULE:FUNCTION", help="the task, e.g. greet_typed:greet or path/to/greet_typed.py:greet")
    schema.add_argument("--out", required=True, type=Path, metavar="DIR", help="the folder to write into (made if missing)")
    schema.add_argument(
        "--check",
        action="store_true",
        help="write nothing; fail (exit 1) if the files in DIR differ from what would be written",
    )
    args = parser.parse_args(argv)
    try:
        task = load(args.target)
    except SchemaError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        differ = stale(task, args.out)
        for path in differ:
            print(
                f"error: {path} is not the schema {args.target} declares; "
                f"run: python -m perago_body schema {args.target} --out {args.out}",
                file=sys.stderr,
            )
        return 1 if differ else 0
    params, result = write(task, args.out)
    print(f"wrote {params} and {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
