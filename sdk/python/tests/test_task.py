"""One request's outcome: validation, the function's errors, the result's check."""

import asyncio

import pytest
from pydantic import BaseModel, Field

from perago_body import Context, Task, TerminalError, task
from perago_body._task import Completed, Failed


class Params(BaseModel):
    name: str
    times: int = Field(1, ge=1, le=10)


class Result(BaseModel):
    message: str
    length: int = Field(ge=0)


def ctx() -> Context:
    return Context.of_request(
        {"execution_id": "e1", "task_id": "t1", "workflow_id": "w1", "worker_id": "x0001", "workspace_dir": None}
    )


def call(t: Task, params):
    return t.call(params, ctx(), lambda c: asyncio.new_event_loop().run_until_complete(c))


@task(params=Params, result=Result)
def greet(params: Params, ctx: Context) -> Result:
    if params.name == "terminal":
        raise TerminalError("no greeting for terminal")
    if params.name == "value":
        raise ValueError("bad name")
    if params.name == "negative":
        return {"message": "x", "length": -1}
    if params.name == "dict":
        return {"message": "from a dict", "length": 4}
    if params.name == "exit":
        raise SystemExit(3)
    return Result(message=" ".join([f"hello, {params.name}!"] * params.times), length=len(params.name))


def test_valid_params_give_the_models_json():
    assert call(greet, {"name": "Ada", "times": 2}) == Completed('{"message":"hello, Ada! hello, Ada!","length":3}')


def test_a_dict_that_validates_is_the_result():
    assert call(greet, {"name": "dict"}) == Completed('{"message":"from a dict","length":4}')


def test_params_that_do_not_validate_are_terminal_and_name_the_field():
    out = call(greet, {"times": 11})
    assert out == Failed(
        "bad input: params do not match Params: params/name: Field required; "
        "params/times: Input should be less than or equal to 10",
        True,
    )
    # Not an object at all.
    out = call(greet, None)
    assert isinstance(out, Failed) and out.terminal and out.message.startswith("bad input: params do not match Params: params: ")


def test_many_violations_list_three_and_count_the_rest():
    class Wide(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int

    t = task(params=Wide, result=Result)(lambda p, c: None)
    out = call(t, {})
    assert out.terminal and out.message.endswith("params/c: Field required; and 2 more"), out


def test_terminal_error_is_terminal_with_its_message():
    assert call(greet, {"name": "terminal"}) == Failed("no greeting for terminal", True)


def test_any_other_exception_is_retried_with_its_type_and_message(capsys):
    assert call(greet, {"name": "value"}) == Failed("ValueError: bad name", False)
    # The traceback goes to stderr (the assignment's log).
    assert "Traceback" in capsys.readouterr().err


def test_sys_exit_in_the_function_fails_the_task_only():
    assert call(greet, {"name": "exit"}) == Failed("the task function called sys.exit(3)", False)


def test_a_result_that_does_not_match_fails_naming_the_field():
    out = call(greet, {"name": "negative"})
    assert out == Failed("result does not match Result: result/length: Input should be greater than or equal to 0", False)


def test_a_result_that_is_not_the_model_is_validated():
    class Other(BaseModel):
        message: str

    t = task(params=Params, result=Result)(lambda p, c: Other(message="m"))
    out = call(t, {"name": "a"})
    assert out == Failed("result does not match Result: result/length: Field required", False)
    t = task(params=Params, result=Result)(lambda p, c: object())
    out = call(t, {"name": "a"})
    assert isinstance(out, Failed) and not out.terminal and out.message.startswith("result does not match Result: result: ")


def test_a_function_may_take_only_the_params():
    @task(params=Params, result=Result)
    def one(params):
        return Result(message=params.name, length=1)

    assert call(one, {"name": "solo"}) == Completed('{"message":"solo","length":1}')


def test_async_functions_are_awaited():
    @task(params=Params, result=Result)
    async def slow(params, ctx):
        await asyncio.sleep(0.01)
        if params.name == "boom":
            raise TerminalError("async boom")
        return Result(message=f"{ctx.execution_id}:{params.name}", length=1)

    assert slow.is_async
    assert call(slow, {"name": "a"}) == Completed('{"message":"e1:a","length":1}')
    assert call(slow, {"name": "boom"}) == Failed("async boom", True)


def test_the_decorated_function_stays_callable():
    assert greet(Params(name="Bo"), ctx()).message == "hello, Bo!"
    assert greet.__name__ == "greet"


def test_aliases_are_written_as_the_schema_names_them():
    class Aliased(BaseModel):
        full_name: str = Field(alias="fullName")

    t = task(params=Params, result=Aliased)(lambda p, c: Aliased(fullName="x"))
    assert call(t, {"name": "a"}) == Completed('{"fullName":"x"}')


@pytest.mark.parametrize("setting", ["params", "result"])
def test_a_contract_that_is_not_a_model_names_the_setting(setting):
    args = {"params": Params, "result": Result, setting: dict}
    with pytest.raises(TypeError, match=rf"@task\({setting}=…\): <class 'dict'> is not a Pydantic model class"):
        task(**args)


def test_the_context_reads_the_request():
    c = Context.of_request(
        {"execution_id": "e", "task_id": "t", "workflow_id": "w", "worker_id": "x", "workspace_dir": "/ws/a"}
    )
    assert (c.execution_id, c.task_id, c.workflow_id, c.worker_id, str(c.workspace_dir)) == ("e", "t", "w", "x", "/ws/a")
    assert not c.cancelled.is_set()
    assert ctx().workspace_dir is None


def test_a_validator_that_raises_something_else_fails_the_task_only():
    from pydantic import field_validator

    class Picky(BaseModel):
        name: str

        @field_validator("name")
        @classmethod
        def no_type_errors(cls, value):
            raise TypeError("a validator bug")

    t = task(params=Picky, result=Result)(lambda p, c: None)
    assert call(t, {"name": "a"}) == Failed("validating the params as Picky: TypeError: a validator bug", False)


def test_the_context_carries_the_trace_context_when_traced():
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    c = Context.of_request(
        {"execution_id": "e", "task_id": "t", "workflow_id": "w", "worker_id": "x", "workspace_dir": None,
         "traceparent": parent, "tracestate": "a=1"}
    )
    assert (c.traceparent, c.tracestate) == (parent, "a=1")
    assert c.trace_carrier() == {"traceparent": parent, "tracestate": "a=1"}
    untraced = Context.of_request({"execution_id": "e", "traceparent": 7})
    assert untraced.traceparent is None and untraced.trace_carrier() == {}
