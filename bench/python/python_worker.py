"""The peer of the benchmarks: conductor-python's own TaskHandler with N worker processes, each
running a Python function that returns its params. Started by perago-bench; stops on SIGTERM.

env: CONDUCTOR_SERVER_URL, BENCH_TASK (task name), BENCH_PROCESSES (worker processes)
"""

import os
import signal
import sys
import time

from conductor.client.automator.task_handler import TaskHandler
from conductor.client.configuration.configuration import Configuration
from conductor.client.worker.worker import Worker


def echo(task):
    return {"result": task.input_data.get("params")}


def main() -> None:
    name = os.environ["BENCH_TASK"]
    processes = int(os.environ["BENCH_PROCESSES"])
    configuration = Configuration(server_api_url=os.environ["CONDUCTOR_SERVER_URL"])
    workers = [
        Worker(task_definition_name=name, execute_function=echo, thread_count=1, worker_id=f"python{n}")
        for n in range(processes)
    ]
    handler = TaskHandler(workers=workers, configuration=configuration, scan_for_annotated_workers=False,
                          import_modules=[])
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    handler.start_processes()
    print("ready", flush=True)
    try:
        while not stop["now"]:
            time.sleep(0.05)
    finally:
        handler.stop_processes()
    sys.exit(0)


if __name__ == "__main__":
    main()
