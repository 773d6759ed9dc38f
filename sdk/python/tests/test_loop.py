"""The jsonl protocol as the executor speaks it: a real body process on pipes."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import env_with_src

BODY = textwrap.dedent(
    '''
    import asyncio, logging, os, subprocess, sys
    from pydantic import BaseModel
    from perago_body import Context, TerminalError, task

    if os.environ.get("PRINT_AT_IMPORT"):
        print("printed at import")      # buffered (no -u), then sent to stderr by run()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="log: %(message)s")

    class Params(BaseModel):
        op: str
        text: str = ""

    class Result(BaseModel):
        op: str
        text: str = ""
        cancelled: bool = False
        ids: list = []

    @task(params=Params, result=Result)
    def body(params, ctx):
        if params.op == "echo":
            return Result(op="echo", text=params.text)
        if params.op == "noisy":
            print("a print")
            logging.info("a log line")
            os.write(1, b"fd one\\n")
            subprocess.run(["echo", "a child"], check=True)
            return Result(op="noisy")
        if params.op == "wait":
            got = ctx.cancelled.wait(20)
            return Result(op="wait", cancelled=got)
        if params.op == "ids":
            return Result(op="ids", ids=[ctx.execution_id, ctx.task_id, ctx.workflow_id, ctx.worker_id, str(ctx.workspace_dir)])
        if params.op == "big":
            return Result(op="big", text="é" * (len(params.text)))
        if params.op == "terminal":
            raise TerminalError("stop")
        if params.op == "stdin":
            return Result(op="stdin", text=repr(sys.stdin.read()))
        raise ValueError(f"unknown op {params.op}")

    if __name__ == "__main__":
        body.run()
    '''
)

ASYNC_BODY = textwrap.dedent(
    '''
    import asyncio
    from pydantic import BaseModel
    from perago_body import task

    class Params(BaseModel):
        n: int

    class Result(BaseModel):
        n: int
        cancelled: bool

    @task(params=Params, result=Result)
    async def body(params, ctx):
        for _ in range(2000):
            if ctx.cancelled.is_set():
                return Result(n=params.n, cancelled=True)
            await asyncio.sleep(0.01)
        return Result(n=params.n, cancelled=False)

    body.run()
    '''
)


class Body:
    """A body process with the executor's side of its pipes."""

    def __init__(self, tmp_path: Path, source: str, env: dict = None):
        script = tmp_path / "body.py"
        script.write_text(source)
        self.stderr_path = tmp_path / "stderr"
        self.stderr_file = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            env=env if env is not None else env_with_src(),
            cwd=tmp_path,
        )

    def send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, execution_id: str, params: dict, **extra) -> None:
        line = {"execution_id": execution_id, "task_id": "t-" + execution_id, "workflow_id": "w1", "worker_id": "x0001", "params": params, "workspace_dir": None}
        line.update(extra)
        self.send(line)

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        assert line.endswith(b"\n"), (line, self.stderr())
        return json.loads(line)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> int:
        self.proc.stdin.close()
        rest = self.proc.stdout.read()
        code = self.proc.wait(20)
        self.stderr_file.close()
        assert rest == b"", rest
        return code


@pytest.fixture
def body(tmp_path):
    b = Body(tmp_path, BODY)
    yield b
    if b.proc.poll() is None:
        b.proc.kill()
        b.proc.wait()


def test_answers_each_request_with_its_execution_id_and_survives_errors(body):
    body.request("e1", {"op": "echo", "text": "one"})
    assert body.answer() == {"execution_id": "e1", "result": {"op": "echo", "text": "one", "cancelled": False, "ids": []}}
    body.request("e2", {"op": "nope"})
    assert body.answer() == {"execution_id": "e2", "error": {"message": "ValueError: unknown op nope", "terminal": False}}
    body.request("e3", {"op": "terminal"})
    assert body.answer() == {"execution_id": "e3", "error": {"message": "stop", "terminal": True}}
    body.request("e4", {"text": "no op"})
    assert body.answer() == {
        "execution_id": "e4",
        "error": {"message": "bad input: params do not match Params: params/op: Field required", "terminal": True},
    }
    body.request("e5", {"op": "echo", "text": "still here"})
    assert body.answer()["result"]["text"] == "still here"
    assert body.close() == 0


def test_stdout_carries_only_answers(body):
    body.request("e1", {"op": "noisy"})
    assert body.answer() == {"execution_id": "e1", "result": {"op": "noisy", "text": "", "cancelled": False, "ids": []}}
    # The function cannot read the requests either.
    body.request("e2", {"op": "stdin"})
    assert body.answer()["result"]["text"] == "''"
    assert body.close() == 0
    err = body.stderr()
    for line in ["a print", "log: a log line", "fd one", "a child"]:
        assert line in err.splitlines(), err


def test_a_buffered_print_at_import_goes_to_stderr(tmp_path):
    env = {**env_with_src(), "PRINT_AT_IMPORT": "1"}
    env.pop("PYTHONUNBUFFERED", None)
    b = Body(tmp_path, BODY, env=env)
    b.request("e1", {"op": "echo", "text": "x"})
    assert b.answer()["execution_id"] == "e1"
    assert b.close() == 0
    assert "printed at import" in b.stderr().splitlines(), b.stderr()


def test_the_context_has_the_requests_ids(body):
    body.request("e9", {"op": "ids"}, workspace_dir="/ws/attempt")
    assert body.answer()["result"]["ids"] == ["e9", "t-e9", "w1", "x0001", "/ws/attempt"]
    body.close()


def test_a_cancel_line_sets_ctx_cancelled_while_the_function_runs(body):
    body.request("e1", {"op": "wait"})
    started = time.monotonic()
    body.send({"cancel": "e1"})
    assert body.answer() == {"execution_id": "e1", "result": {"op": "wait", "text": "", "cancelled": True, "ids": []}}
    assert time.monotonic() - started < 10
    # A late cancel (after the answer) and one for another execution are ignored: no line.
    body.send({"cancel": "e1"})
    body.send({"cancel": "other"})
    body.request("e2", {"op": "echo", "text": "next"})
    assert body.answer() == {"execution_id": "e2", "result": {"op": "echo", "text": "next", "cancelled": False, "ids": []}}
    assert body.close() == 0


def test_an_async_function_sees_the_cancel(tmp_path):
    b = Body(tmp_path, ASYNC_BODY)
    b.request("e1", {"n": 1})
    b.send({"cancel": "e1"})
    assert b.answer() == {"execution_id": "e1", "result": {"n": 1, "cancelled": True}}
    b.request("e2", {"n": 2})
    b.send({"cancel": "e2"})
    assert b.answer() == {"execution_id": "e2", "result": {"n": 2, "cancelled": True}}
    assert b.close() == 0


def test_megabytes_of_unicode_in_and_out(body):
    text = "ü€𝄞" * (2 * 1024 * 1024)  # a params line of ~18 MB
    body.request("e1", {"op": "echo", "text": text})
    assert body.answer()["result"]["text"] == text
    body.request("e2", {"op": "big", "text": "x" * (4 * 1024 * 1024)})
    line = body.answer()
    assert line["result"]["text"] == "é" * (4 * 1024 * 1024)
    assert body.close() == 0


def test_lines_that_are_not_requests_are_ignored_on_stderr(body):
    body.proc.stdin.write(b"not json\n[1]\n{\"params\": {}}\n\n")
    body.request("e1", {"op": "echo", "text": "after"})
    assert body.answer()["execution_id"] == "e1"
    assert body.close() == 0
    err = body.stderr()
    assert "perago_body: ignored a line that is not JSON" in err
    assert "perago_body: ignored a line that is not a JSON object: b'[1]\\n'" in err
    assert "perago_body: ignored a request without an execution_id" in err
