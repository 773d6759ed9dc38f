"""perago's `jsonl` body protocol, served for a :class:`~perago_body.Task`.

One request line per assignment arrives on stdin::

    {"execution_id": "…", "task_id": "…", "workflow_id": "…", "worker_id": "…", "params": {…}, "workspace_dir": "…"}

and exactly one answer line goes back on stdout, with the same execution id::

    {"execution_id": "…", "result": …}
    {"execution_id": "…", "error": {"message": "…", "terminal": false}}

At the soft time limit the line ``{"cancel": "<execution id>"}`` follows the request: a reader
thread takes the lines while the function runs, so the cancel sets ``ctx.cancelled`` at once. A
cancel for an execution already answered is ignored (it can come just after the answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sys
import threading
from typing import Any, BinaryIO, Dict, Optional

from ._task import Completed, Context, Failed, Outcome, Task, describe


def run(task: Task) -> None:
    """Serves `task` on this process's stdin and stdout until stdin ends.

    The protocol's descriptors are moved aside first: stdout becomes a copy of stderr (so
    `print`, logging to stdout, and any child process's output reach the log, never the
    protocol) and stdin becomes /dev/null (nothing but this loop reads the requests). The
    copies Python makes are not inherited by child processes."""
    requests_fd = os.dup(0)
    answers_fd = os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # What was printed before and is still buffered goes to stderr now, as what comes after.
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.stdout = sys.stderr
    with open(requests_fd, "rb") as requests, open(answers_fd, "wb") as answers:
        serve(task, requests, answers)


def serve(task: Task, requests: BinaryIO, answers: BinaryIO) -> None:
    """Answers each request read from `requests` on `answers`, one line each, flushed; returns
    when `requests` ends (or `answers` is closed by the other side)."""
    pending: Dict[str, Context] = {}
    lock = threading.Lock()
    work: "queue.SimpleQueue[Optional[tuple[Context, Any]]]" = queue.SimpleQueue()

    def read() -> None:
        try:
            for line in iter(requests.readline, b""):
                taken = _request(line, pending, lock)
                if taken is not None:
                    work.put(taken)
        except (OSError, ValueError) as error:
            _note(f"cannot read the requests: {error}")
        finally:
            work.put(None)

    threading.Thread(target=read, name="perago-body-requests", daemon=True).start()
    loop: Optional[asyncio.AbstractEventLoop] = None

    def run_coroutine(coroutine: Any) -> Any:
        nonlocal loop
        if loop is None:
            loop = asyncio.new_event_loop()
        return loop.run_until_complete(coroutine)

    try:
        while True:
            item = work.get()
            if item is None:
                return
            ctx, params = item
            try:
                outcome = task.call(params, ctx, run_coroutine)
            except Exception as error:  # noqa: BLE001 - the loop outlives any one request
                outcome = Failed(f"perago_body: {describe(error)}", False)
            # What the function wrote to stderr belongs to this assignment: it goes first.
            _flush(sys.stderr)
            try:
                answers.write(answer_line(ctx.execution_id, outcome))
                answers.flush()
            except (BrokenPipeError, ValueError):
                return
            finally:
                with lock:
                    pending.pop(ctx.execution_id, None)
    finally:
        if loop is not None:
            loop.close()


def _request(line: bytes, pending: Dict[str, Context], lock: threading.Lock) -> Optional["tuple[Context, Any]"]:
    """Takes one line: a request (returned, to run) or a cancel (applied at once)."""
    if not line.strip():
        return None
    try:
        message = json.loads(line)
    except ValueError as error:
        _note(f"ignored a line that is not JSON ({error}): {line[:120]!r}")
        return None
    if not isinstance(message, dict):
        _note(f"ignored a line that is not a JSON object: {line[:120]!r}")
        return None
    if "cancel" in message:
        with lock:
            ctx = pending.get(str(message["cancel"]))
        if ctx is not None:
            ctx.cancelled.set()
        return None
    if not isinstance(message.get("execution_id"), str):
        _note(f"ignored a request without an execution_id: {line[:120]!r}")
        return None
    ctx = Context.of_request(message)
    with lock:
        pending[ctx.execution_id] = ctx
    return ctx, message.get("params")


def answer_line(execution_id: str, outcome: Outcome) -> bytes:
    """The answer line for `outcome`, newline included, as UTF-8."""
    head = '{"execution_id":' + json.dumps(execution_id)
    if isinstance(outcome, Completed):
        text = head + ',"result":' + outcome.json + "}\n"
    else:
        assert isinstance(outcome, Failed)
        error = json.dumps({"message": outcome.message, "terminal": outcome.terminal})
        text = head + ',"error":' + error + "}\n"
    return text.encode("utf-8")


def _note(text: str) -> None:
    print(f"perago_body: {text}", file=sys.stderr, flush=True)


def _flush(stream: Any) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


__all__ = ["run", "serve", "answer_line"]
