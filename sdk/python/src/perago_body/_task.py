"""The `@task` decorator: a typed function and the answer it gives to one request."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pydantic

# The first violations a message lists (as perago's own schema check does).
MAX_LISTED_VIOLATIONS = 3


class TerminalError(Exception):
    """Raised by a task function: the task fails with FAILED_WITH_TERMINAL_ERROR, and Conductor
    does not retry it. Any other exception fails it with FAILED (retried as the TaskDef says)."""


@dataclass(frozen=True)
class Context:
    """What a task function knows about the assignment it runs."""

    #: This execution of the task (one per assignment; a retry is a new one).
    execution_id: str
    #: The Conductor task id.
    task_id: str
    #: The Conductor workflow id.
    workflow_id: str
    #: The perago worker (executor) running it.
    worker_id: str
    #: The workspace directory of a workspace task; None for a workspace-free one.
    workspace_dir: Optional[Path]
    #: While the runtime exports traces (OTEL_EXPORTER_OTLP_ENDPOINT): the W3C traceparent of
    #: the attempt's `body` span, for the function's own spans to be its children (an
    #: OpenTelemetry propagator extracts it from ``ctx.trace_carrier()``). None otherwise.
    traceparent: Optional[str] = None
    #: The trace's W3C tracestate, when it has one.
    tracestate: Optional[str] = None
    #: Set when the soft time limit (`body.soft_time_limit`) is reached: check it
    #: (`ctx.cancelled.is_set()`, or `ctx.cancelled.wait(seconds)`) and return what you have.
    cancelled: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def of_request(cls, request: dict) -> "Context":
        """The context of a jsonl request line (parsed)."""
        workspace = request.get("workspace_dir")
        return cls(
            execution_id=str(request.get("execution_id", "")),
            task_id=str(request.get("task_id") or ""),
            workflow_id=str(request.get("workflow_id") or ""),
            worker_id=str(request.get("worker_id") or ""),
            workspace_dir=Path(workspace) if workspace else None,
            traceparent=_text_or_none(request.get("traceparent")),
            tracestate=_text_or_none(request.get("tracestate")),
        )

    def trace_carrier(self) -> dict:
        """The trace context as W3C headers (empty when not traced): what
        ``opentelemetry.propagate.extract`` takes to continue the attempt's trace."""
        carrier = {}
        if self.traceparent:
            carrier["traceparent"] = self.traceparent
            if self.tracestate:
                carrier["tracestate"] = self.tracestate
        return carrier


def _text_or_none(value) -> Optional[str]:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Completed:
    """The function's result, as the JSON text of the result model."""

    json: str


@dataclass(frozen=True)
class Failed:
    """The function failed: the message, and whether a retry could help."""

    message: str
    terminal: bool


Outcome = Union[Completed, Failed]


def violations(label: str, error: pydantic.ValidationError) -> str:
    """A validation error as `label/field: message; …; and N more`, each field a JSON pointer
    below `label` (`params/times: Input should be less than or equal to 10`)."""
    listed = []
    for item in error.errors()[:MAX_LISTED_VIOLATIONS]:
        pointer = "".join(f"/{part}" for part in item.get("loc", ()))
        listed.append(f"{label}{pointer}: {item.get('msg', 'invalid')}")
    more = error.error_count() - len(listed)
    if more > 0:
        listed.append(f"and {more} more")
    return "; ".join(listed)


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, pydantic.BaseModel)


class Task:
    """A task function with its contract: the Pydantic models of its params and its result.

    Calling it calls the function; :meth:`run` serves perago's `jsonl` body protocol."""

    def __init__(self, fn: Callable, params: type, result: type):
        if not callable(fn):
            raise TypeError(f"@task decorates a function, not {type(fn).__name__}")
        if not _is_model(params):
            raise TypeError(
                f"@task(params=…): {params!r} is not a Pydantic model class (a subclass of pydantic.BaseModel)"
            )
        if not _is_model(result):
            raise TypeError(
                f"@task(result=…): {result!r} is not a Pydantic model class (a subclass of pydantic.BaseModel)"
            )
        self.fn = fn
        self.params_model = params
        self.result_model = result
        self.is_async = inspect.iscoroutinefunction(fn)
        self._takes_ctx = _takes_two(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<perago_body task {self.fn.__module__}.{self.fn.__qualname__}>"

    def run(self) -> None:
        """Serves the `jsonl` protocol on this process's stdin and stdout until stdin ends, then
        exits. Prints (and anything else written to stdout, by this process or its children)
        go to stderr: stdout carries only the answers."""
        from ._loop import run

        run(self)

    def schemas(self) -> "tuple[dict, dict]":
        """The JSON Schemas of the params and of the result (see `perago_body.schema`)."""
        from ._schema import schemas

        return schemas(self)

    def call(self, params: Any, ctx: Context, run_coroutine: Callable[[Any], Any]) -> Outcome:
        """Runs the function for one request's `params`: validates them, calls it, checks what
        it returned. Never raises for what the function or its input does."""
        try:
            model = self.params_model.model_validate(params)
        except pydantic.ValidationError as error:
            name = self.params_model.__name__
            return Failed(f"bad input: params do not match {name}: {violations('params', error)}", True)
        except Exception as error:  # noqa: BLE001 - a validator that raised something else
            traceback.print_exc(file=sys.stderr)
            return Failed(f"validating the params as {self.params_model.__name__}: {describe(error)}", False)
        args = (model, ctx) if self._takes_ctx else (model,)
        try:
            value = self.fn(*args)
            if self.is_async or inspect.isawaitable(value):
                value = run_coroutine(value)
        except TerminalError as error:
            return Failed(str(error) or "TerminalError", True)
        except SystemExit as error:
            return Failed(f"the task function called sys.exit({error.code!r})", False)
        except Exception as error:  # noqa: BLE001 - any failure of the function is its task's
            traceback.print_exc(file=sys.stderr)
            return Failed(describe(error), False)
        return self.completed(value)

    def completed(self, value: Any) -> Outcome:
        """The result's JSON, if `value` is (or validates as) the result model."""
        name = self.result_model.__name__
        try:
            if not isinstance(value, self.result_model):
                if isinstance(value, pydantic.BaseModel):
                    value = value.model_dump(by_alias=True)
                value = self.result_model.model_validate(value)
            return Completed(value.model_dump_json(by_alias=True))
        except pydantic.ValidationError as error:
            return Failed(f"result does not match {name}: {violations('result', error)}", False)
        except Exception as error:  # noqa: BLE001 - e.g. a value that cannot be serialized
            return Failed(f"result does not serialize as {name}: {describe(error)}", False)


def describe(error: BaseException) -> str:
    """`TypeName: message` (just the type when there is no message)."""
    text = str(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else name


def _takes_two(fn: Callable) -> bool:
    """Whether `fn` takes `(params, ctx)`, not just `(params)`."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    positional = 0
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def task(*, params: type, result: type) -> Callable[[Callable], Task]:
    """Declares a task function and its contract::

        @task(params=GreetParams, result=Greeting)
        def greet(params: GreetParams, ctx: Context) -> Greeting:
            ...

        if __name__ == "__main__":
            greet.run()

    The function takes the validated params (and, optionally, the :class:`Context`) and
    returns the result model (or anything that validates as it, such as a dict); it may be an
    `async def`."""
    # Checked here too, so a bad argument fails at the decorator line.
    for setting, model in (("params", params), ("result", result)):
        if not _is_model(model):
            raise TypeError(
                f"@task({setting}=…): {model!r} is not a Pydantic model class (a subclass of pydantic.BaseModel)"
            )

    def decorate(fn: Callable) -> Task:
        return Task(fn, params, result)

    return decorate
