"""Conformance of perago-devstack's lakeFS server with the high-level `lakefs` package.

Driven by devstack/tests/integration/lakefs/python_sdk.rs with the same environment as
lakefs_sdk_conformance.py (LAKEFS_ENDPOINT, LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY).
The package differs from lakefs-sdk on the wire: it reads /config to learn that pre-signed URLs
are off, uploads raw bodies with their own Content-Type and `x-lakefs-meta-*` headers using
`Transfer-Encoding: chunked`, encodes queries with `+` for spaces, sends HEAD before an exclusive
upload, and reads with Range requests.

Exits 0 on success; any failure raises, which exits non-zero with a traceback.
"""

import os
import sys
import uuid

import lakefs
from lakefs.client import Client
from lakefs.exceptions import ConflictException, NotFoundException, ObjectExistsException


def log(message: str) -> None:
    print(f"[lakefs-hl-conformance] {message}", flush=True)


def main() -> int:
    clt = Client(
        host=os.environ["LAKEFS_ENDPOINT"],
        username=os.environ["LAKEFS_ACCESS_KEY_ID"],
        password=os.environ["LAKEFS_SECRET_ACCESS_KEY"],
    )
    name = "hl-" + uuid.uuid4().hex[:8]
    repo = lakefs.Repository(name, client=clt).create(storage_namespace=f"mem://hl/{name}")
    main_branch = repo.branch("main")

    # Raw chunked uploads with content type and metadata; keys with spaces and '+'.
    main_branch.object("in/r.json").upload(data=b'{"a":1}', content_type="application/json", metadata={"k": "v"})
    main_branch.object("in/a b+c.txt").upload(data="text with spaces")
    main_branch.object("in/empty").upload(data=b"")
    stat = main_branch.object("in/r.json").stat()
    assert stat.content_type == "application/json" and stat.metadata == {"k": "v"}, stat
    assert main_branch.object("in/a b+c.txt").reader("r").read() == "text with spaces"
    assert main_branch.object("in/empty").reader("rb").read() == b""
    with main_branch.object("in/r.json").reader("rb") as reader:
        reader.seek(1)
        assert reader.read(3) == b'"a"'
    try:
        main_branch.object("in/r.json").upload(data=b"again", mode="x")
        raise AssertionError("exclusive upload over an existing object")
    except ObjectExistsException:
        pass
    main_branch.object("in/new").upload(data=b"fresh", mode="x")
    main_branch.commit(message="inputs", metadata={"source": "hl"})
    log("uploaded and committed")

    # More objects than one default page, listed through the package's paging generator.
    for i in range(120):
        main_branch.object(f"many/{i:03d}").upload(data=str(i))
    main_branch.commit(message="many")
    listed = [o.path for o in repo.ref("main").objects(prefix="many/")]
    assert listed == [f"many/{i:03d}" for i in range(120)], len(listed)
    tops = [o.path for o in repo.ref("main").objects(delimiter="/")]
    assert tops == ["in/", "many/"], tops

    # A task branch from the commit the inputs were read from; publish by merge.
    base = repo.ref("main").get_commit().id
    task = repo.branch("perago-staging-hl").create(source_reference=base)
    repo.branch("perago-staging-hl").create(source_reference=base, exist_ok=True)
    task.object("out/result.txt").upload(data=b"result")
    task.object("in/r.json").delete()
    task.commit(message="task output", metadata={"execution_id": "hl"})
    reference = task.merge_into(main_branch, message="publish")
    assert len(reference) == 64, reference
    assert repo.ref("main").object("out/result.txt").reader("rb").read() == b"result"
    assert not repo.ref("main").object("in/r.json").exists()
    log(f"merged {reference}")

    # Conflict: both sides change the same path since the merge base.
    base = repo.ref("main").get_commit().id
    task2 = repo.branch("perago-staging-hl2").create(source_reference=base)
    task2.object("out/result.txt").upload(data=b"task")
    task2.commit(message="task")
    main_branch.object("out/result.txt").upload(data=b"someone else")
    main_branch.commit(message="concurrent")
    try:
        task2.merge_into(main_branch)
        raise AssertionError("conflicting merge succeeded")
    except ConflictException as e:
        assert e.status_code == 409, e.status_code
    assert repo.ref("main").object("out/result.txt").reader("rb").read() == b"someone else"
    log("conflict reported: 409")

    for branch in (task, task2):
        branch.delete()
    try:
        repo.branch("perago-staging-hl").get_commit()
        raise AssertionError("deleted branch still there")
    except NotFoundException:
        pass
    repo.delete()
    log("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
