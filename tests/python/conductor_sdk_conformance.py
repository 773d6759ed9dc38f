"""Conformance of perago-devstack's Conductor server with the official Python SDK.

Driven by devstack/tests/integration/python_sdk.rs, which starts the server in-process with a
time scale of 0.05 (one Conductor second lasts 50 ms) and passes its URL as
CONDUCTOR_SERVER_URL. Uses only conductor-python's public API, unchanged:

1. register TaskDefs and a two-step workflow, start 20 workflows, run the SDK's own
   TaskHandler workers until all complete, and check every output;
2. a response-timeout retry seen through the SDK's TaskClient;
3. a terminal failure (NonRetryableException in a TaskHandler worker) seen through the
   WorkflowClient.

Exits 0 on success; any failure raises, which exits non-zero with a traceback.
"""

import os
import sys
import time

from conductor.client.automator.task_handler import TaskHandler
from conductor.client.configuration.configuration import Configuration
from conductor.client.http.models.start_workflow_request import StartWorkflowRequest
from conductor.client.http.models.task_def import TaskDef
from conductor.client.http.models.task_result import TaskResult
from conductor.client.http.models.task_result_status import TaskResultStatus
from conductor.client.orkes_clients import OrkesClients
from conductor.client.worker.exception import NonRetryableException
from conductor.client.worker.worker_task import worker_task
from conductor.client.workflow.conductor_workflow import ConductorWorkflow
from conductor.client.workflow.executor.workflow_executor import WorkflowExecutor
from conductor.client.workflow.task.simple_task import SimpleTask

WORKFLOWS = 20
# Wall-clock patience for anything that waits on workers or timeouts.
PATIENCE_S = float(os.environ.get("PERAGO_SDK_PATIENCE_S", "25"))


@worker_task(task_definition_name="sdk_double")
def double(n: int) -> dict:
    return {"n": n * 2}


@worker_task(task_definition_name="sdk_add_one")
def add_one(n: int) -> dict:
    return {"n": n + 1, "worker": "python"}


@worker_task(task_definition_name="sdk_reject")
def reject(n: int) -> dict:
    raise NonRetryableException(f"cannot handle {n}")


def log(message: str) -> None:
    print(f"[sdk-conformance] {message}", flush=True)


def wait_until(what: str, probe):
    """Calls probe until it returns something truthy, failing after PATIENCE_S."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {PATIENCE_S}s waiting until {what}")
        time.sleep(0.05)


def simple(task_name: str, ref: str, n: str) -> SimpleTask:
    task = SimpleTask(task_name, ref)
    task.input_parameters.update({"n": n})
    return task


def register(clients: OrkesClients, executor: WorkflowExecutor) -> None:
    metadata = clients.get_metadata_client()
    for name in ("sdk_double", "sdk_add_one"):
        metadata.register_task_def(TaskDef(name=name, retry_count=0, response_timeout_seconds=600))
    metadata.register_task_def(
        TaskDef(name="sdk_timeout", retry_count=1, retry_delay_seconds=2, response_timeout_seconds=10,
                timeout_seconds=0)
    )
    metadata.register_task_def(TaskDef(name="sdk_reject", retry_count=3, retry_delay_seconds=1))
    assert metadata.get_task_def("sdk_timeout").response_timeout_seconds == 10

    pipeline = ConductorWorkflow(executor=executor, name="sdk_pipeline", version=1)
    pipeline.add(simple("sdk_double", "double_ref", "${workflow.input.n}"))
    pipeline.add(simple("sdk_add_one", "add_one_ref", "${double_ref.output.n}"))
    pipeline.output_parameters({"result": "${add_one_ref.output.n}", "by": "${add_one_ref.output.worker}"})
    pipeline.register(overwrite=True)

    for name, task in (("sdk_timeout_flow", "sdk_timeout"), ("sdk_reject_flow", "sdk_reject")):
        flow = ConductorWorkflow(executor=executor, name=name, version=1)
        flow.add(simple(task, "only_ref", "${workflow.input.n}"))
        flow.register(overwrite=True)
    assert metadata.get_workflow_def("sdk_pipeline").tasks[1].task_reference_name == "add_one_ref"


def run_pipeline(clients: OrkesClients, configuration: Configuration) -> None:
    workflows = clients.get_workflow_client()
    ids = {}
    for n in range(WORKFLOWS):
        request = StartWorkflowRequest(name="sdk_pipeline", version=1, input={"n": n}, correlation_id=f"c-{n}")
        ids[n] = workflows.start_workflow(request)
    log(f"started {len(ids)} workflows")

    handler = TaskHandler(workers=[], configuration=configuration, scan_for_annotated_workers=True,
                          import_modules=[])
    handler.start_processes()
    try:
        def all_done():
            states = {n: workflows.get_workflow(wid, include_tasks=True) for n, wid in ids.items()}
            return states if all(w.status in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED")
                                 for w in states.values()) else None

        states = wait_until("all pipeline workflows end", all_done)
        for n, workflow in states.items():
            assert workflow.status == "COMPLETED", (n, workflow.status, workflow.reason_for_incompletion)
            assert workflow.output == {"result": n * 2 + 1, "by": "python"}, (n, workflow.output)
            assert workflow.correlation_id == f"c-{n}"
            assert [t.status for t in workflow.tasks] == ["COMPLETED", "COMPLETED"], workflow.tasks
            assert all(t.worker_id for t in workflow.tasks), "the SDK reports its worker id"
        log(f"all {WORKFLOWS} workflows COMPLETED with the expected outputs")

        # Terminal failure through a TaskHandler worker: FAILED_WITH_TERMINAL_ERROR, no retry.
        reject_id = workflows.start_workflow_by_name("sdk_reject_flow", {"n": 7}, version=1)
        workflow = wait_until(
            "the reject workflow ends",
            lambda: (lambda w: w if w.status != "RUNNING" else None)(workflows.get_workflow(reject_id)),
        )
        assert workflow.status == "FAILED", workflow.status
        assert len(workflow.tasks) == 1, "a terminal error is not retried"
        task = workflow.tasks[0]
        assert task.status == "FAILED_WITH_TERMINAL_ERROR", task.status
        assert "cannot handle 7" in task.reason_for_incompletion, task.reason_for_incompletion
        assert "cannot handle 7" in workflow.reason_for_incompletion, workflow.reason_for_incompletion
        log("terminal failure: FAILED_WITH_TERMINAL_ERROR, workflow FAILED, no retry")
    finally:
        handler.stop_processes()


def response_timeout_retry(clients: OrkesClients) -> None:
    workflows = clients.get_workflow_client()
    tasks = clients.get_task_client()
    workflow_id = workflows.start_workflow_by_name("sdk_timeout_flow", {"n": 1}, version=1)
    assert tasks.get_queue_size_for_task("sdk_timeout") == 1

    def poll():
        # On 204 the SDK's poll_task returns an empty Task object, not None.
        task = tasks.poll_task("sdk_timeout", worker_id="sdk-manual")
        return task if task is not None and task.task_id else None

    first = wait_until("the first attempt is polled", poll)
    assert first.status == "IN_PROGRESS" and first.worker_id == "sdk-manual" and first.poll_count == 1
    assert first.retry_count == 0
    # No update: after the response timeout the server schedules a retry.
    retry = wait_until("the retry is polled", poll)
    assert retry.task_id != first.task_id
    assert retry.retry_count == 1, retry.retry_count
    assert retry.retried_task_id == first.task_id
    timed_out = tasks.get_task(first.task_id)
    assert timed_out.status == "TIMED_OUT", timed_out.status
    assert timed_out.reason_for_incompletion.startswith("responseTimeout: 10 exceeded")

    # A late result for the timed-out attempt is accepted and ignored.
    late = TaskResult(workflow_instance_id=workflow_id, task_id=first.task_id, worker_id="sdk-manual",
                      status=TaskResultStatus.COMPLETED, output_data={"late": True})
    assert tasks.update_task(late) == first.task_id
    assert tasks.get_task(first.task_id).status == "TIMED_OUT"

    tasks.add_task_log(retry.task_id, "finishing the retry")
    done = TaskResult(workflow_instance_id=workflow_id, task_id=retry.task_id, worker_id="sdk-manual",
                      status=TaskResultStatus.COMPLETED, output_data={"n": 42})
    assert tasks.update_task(done) == retry.task_id
    assert [entry.log for entry in tasks.get_task_logs(retry.task_id)] == ["finishing the retry"]
    workflow = workflows.get_workflow(workflow_id, include_tasks=True)
    assert workflow.status == "COMPLETED", workflow.status
    assert workflow.output == {"n": 42}, workflow.output
    assert [t.status for t in workflow.tasks] == ["TIMED_OUT", "COMPLETED"]
    log("response timeout: TIMED_OUT, retry with retryCount 1 and retriedTaskId, late result ignored")


def main() -> int:
    url = os.environ["CONDUCTOR_SERVER_URL"]
    configuration = Configuration(server_api_url=url)
    clients = OrkesClients(configuration=configuration)
    executor = WorkflowExecutor(configuration)
    log(f"server {url}")
    register(clients, executor)
    response_timeout_retry(clients)
    run_pipeline(clients, configuration)
    log("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
