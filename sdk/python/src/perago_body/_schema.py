"""JSON Schemas from a task's models, for the manifest's `params_schema` / `result_schema`."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

from ._task import Task

#: The dialect Pydantic generates (perago's validator reads `$schema`).
DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: The files `schema --out DIR` writes.
PARAMS_FILE = "params.json"
RESULT_FILE = "result.json"


class SchemaError(Exception):
    """The target cannot be loaded, or is not a task."""


def schemas(task: Task) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The params schema (what the params may be: Pydantic's validation mode) and the result
    schema (what the body writes: its serialization mode, the names by alias as the answer
    has them)."""
    params = task.params_model.model_json_schema(by_alias=True, mode="validation")
    result = task.result_model.model_json_schema(by_alias=True, mode="serialization")
    return _document(params), _document(result)


def _document(schema: Dict[str, Any]) -> Dict[str, Any]:
    return {"$schema": DIALECT, **schema}


def render(schema: Dict[str, Any]) -> str:
    """A schema file's text."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def load(target: str) -> Task:
    """The task `MODULE:FUNCTION` names: MODULE is a dotted module name (importable from the
    current folder) or a path to a `.py` file."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise SchemaError(f"{target}: expected MODULE:FUNCTION (e.g. greet_typed:greet)")
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name).resolve()
        if not path.is_file():
            raise SchemaError(f"{target}: {path} is not a file")
        # Its own imports resolve beside it, as when it runs as a script.
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise SchemaError(f"{target}: cannot import {module_name}: {error}") from error
    value = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise SchemaError(f"{target}: {module_name} has no attribute {attribute}")
        value = getattr(value, part)
    if not isinstance(value, Task):
        raise SchemaError(
            f"{target}: {attribute} is not a task function (decorate it with @perago_body.task(params=…, result=…))"
        )
    return value


def write(task: Task, out: Path) -> Tuple[Path, Path]:
    """Writes `params.json` and `result.json` into `out` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    params, result = schemas(task)
    written = []
    for name, schema in ((PARAMS_FILE, params), (RESULT_FILE, result)):
        path = out / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written[0], written[1]


def stale(task: Task, out: Path) -> list:
    """The schema files in `out` that differ from what `write` would write (or are missing)."""
    params, result = schemas(task)
    differ = []
    for name, schema in ((PARAMS_FILE, params), (RESULT_FILE, result)):
        path = out / name
        try:
            current = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            current = None
        if current != schema:
            differ.append(path)
    return differ
