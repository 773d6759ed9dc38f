"""Typed Python task bodies for perago.

Write a task as a function with a Pydantic contract; perago_body serves perago's `jsonl` body
protocol for it (manifest: ``protocol = "jsonl"``)::

    from pydantic import BaseModel
    from perago_body import Context, task

    class Params(BaseModel):
        name: str

    class Greeting(BaseModel):
        message: str

    @task(params=Params, result=Greeting)
    def greet(params: Params, ctx: Context) -> Greeting:
        return Greeting(message=f"hello, {params.name}!")

    if __name__ == "__main__":
        greet.run()

``python -m perago_body schema greet:greet --out schemas`` writes the JSON Schemas the
manifest's ``params_schema`` and ``result_schema`` name.
"""

from ._task import Context, Task, TerminalError, task

__all__ = ["Context", "Task", "TerminalError", "task"]
__version__ = "0.1.0"
