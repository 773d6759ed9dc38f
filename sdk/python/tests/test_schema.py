"""`python -m perago_body schema`: the JSON Schemas of a task's models, for its manifest."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import env_with_src

REPO = Path(__file__).resolve().parents[3]

MODULE = textwrap.dedent(
    '''
    from typing import List, Optional
    from pydantic import BaseModel, Field
    from perago_body import task

    class Item(BaseModel):
        sku: str

    class Params(BaseModel):
        items: List[Item]
        note: Optional[str] = None

    class Result(BaseModel):
        total_count: int = Field(alias="totalCount", ge=0)

    @task(params=Params, result=Result)
    def order(params, ctx):
        return Result(totalCount=len(params.items))

    not_a_task = 1

    if __name__ == "__main__":
        raise SystemExit("imported as a script: the loop would start")
    '''
)


def schema(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perago_body", "schema", *args],
        cwd=cwd,
        env=env_with_src(),
        capture_output=True,
        text=True,
    )


def test_writes_params_and_result_schemas(tmp_path):
    (tmp_path / "orders.py").write_text(MODULE)
    run = schema(tmp_path, "orders:order", "--out", "schemas")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "wrote schemas/params.json and schemas/result.json\n"
    params = json.loads((tmp_path / "schemas/params.json").read_text())
    result = json.loads((tmp_path / "schemas/result.json").read_text())
    assert params["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert params["required"] == ["items"]
    # Nested models are $defs, referenced from inside the document.
    assert params["properties"]["items"]["items"] == {"$ref": "#/$defs/Item"}
    assert params["$defs"]["Item"]["required"] == ["sku"]
    # The result by alias, as the answer writes it.
    assert result["required"] == ["totalCount"]
    assert result["properties"]["totalCount"]["minimum"] == 0
    # --check agrees, then sees a change.
    assert schema(tmp_path, "orders:order", "--out", "schemas", "--check").returncode == 0
    (tmp_path / "schemas/result.json").write_text("{}")
    stale = schema(tmp_path, "orders:order", "--out", "schemas", "--check")
    assert stale.returncode == 1
    assert stale.stderr == (
        "error: schemas/result.json is not the schema orders:order declares; "
        "run: python -m perago_body schema orders:order --out schemas\n"
    )


def test_a_file_path_names_the_module_too(tmp_path):
    (tmp_path / "orders.py").write_text(MODULE)
    run = schema(tmp_path.parent, f"{tmp_path / 'orders.py'}:order", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out/params.json").exists() and (tmp_path / "out/result.json").exists()


def test_bad_targets_are_named(tmp_path):
    (tmp_path / "orders.py").write_text(MODULE)
    cases = {
        "orders": "error: orders: expected MODULE:FUNCTION (e.g. greet_typed:greet)\n",
        "orders:missing": "error: orders:missing: orders has no attribute missing\n",
        "orders:not_a_task": "error: orders:not_a_task: not_a_task is not a task function (decorate it with @perago_body.task(params=…, result=…))\n",
        "nowhere:order": "error: nowhere:order: cannot import nowhere: No module named 'nowhere'\n",
    }
    for target, message in cases.items():
        run = schema(tmp_path, target, "--out", "schemas")
        assert (run.returncode, run.stderr) == (1, message), target
    assert not (tmp_path / "schemas").exists()
    usage = schema(tmp_path, "orders:order")
    assert usage.returncode == 2 and "--out" in usage.stderr


def test_the_typed_example_ships_the_schemas_its_code_declares():
    example = REPO / "examples/greet-typed"
    run = schema(example, "greet_typed:greet", "--out", "schemas", "--check")
    assert run.returncode == 0, run.stderr
