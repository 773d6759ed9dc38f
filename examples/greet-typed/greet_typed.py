"""The greet task as a typed function: perago_body validates the params, serves the jsonl
protocol, and generates the schemas (python -m perago_body schema greet_typed:greet --out schemas)."""

import os

from pydantic import BaseModel, Field

from perago_body import Context, TerminalError, task

GREETING = os.environ.get("GREETING", "hello")


class GreetParams(BaseModel):
    name: str
    times: int = Field(1, ge=1, le=10)


class Greeting(BaseModel):
    message: str
    length: int = Field(ge=0)


@task(params=GreetParams, result=Greeting)
def greet(params: GreetParams, ctx: Context) -> Greeting:
    if not params.name:
        raise TerminalError("params.name is empty")
    # print goes to stderr: the assignment's log, with its ids.
    print(f"greeting {params.name} {params.times} time(s) as {ctx.worker_id}")
    return Greeting(message=" ".join([f"{GREETING}, {params.name}!"] * params.times), length=len(params.name))


if __name__ == "__main__":
    greet.run()
