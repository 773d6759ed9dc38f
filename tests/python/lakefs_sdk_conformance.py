"""Conformance of perago-devstack's lakeFS server with the official generated client.

Driven by devstack/tests/integration/lakefs_sdk.rs, which starts the server in-process and
passes LAKEFS_ENDPOINT (http://HOST:PORT, without /api/v1), LAKEFS_ACCESS_KEY_ID and
LAKEFS_SECRET_ACCESS_KEY. Uses only lakefs-sdk's public API (LakeFSClient), unchanged:

1. bad credentials raise UnauthorizedException; health check; create a repository;
2. upload more objects than one page (multipart, as the SDK sends it; an empty file; keys with
   spaces, '+' and non-ASCII), list them page by page and with a delimiter, stat and read back;
3. commit with metadata, create a branch from the commit id, change/add/delete objects on it,
   commit, diff, merge into main and read the merged state;
4. produce a conflict (both sides changed a path since the merge base): ApiException 409,
   nothing merged;
5. delete objects (one and many) and the branch.

Exits 0 on success; any failure raises, which exits non-zero with a traceback.
"""

import os
import sys
import uuid

import lakefs_sdk
from lakefs_sdk.client import LakeFSClient
from lakefs_sdk.exceptions import ApiException, NotFoundException, UnauthorizedException
from lakefs_sdk.models import BranchCreation, CommitCreation, Merge, PathList, RepositoryCreation

OBJECTS = 250  # more than the default page (100) and than the pages requested below
PAGE = 60


def log(message: str) -> None:
    print(f"[lakefs-sdk-conformance] {message}", flush=True)


def client(key: str, secret: str) -> LakeFSClient:
    # LakeFSClient appends /api/v1 to a host without a path, as users usually write it.
    config = lakefs_sdk.Configuration(host=os.environ["LAKEFS_ENDPOINT"], username=key, password=secret)
    return LakeFSClient(config)


def list_all(clt: LakeFSClient, repo: str, ref: str, **kwargs) -> list:
    objects, after, pages = [], "", 0
    while True:
        page = clt.objects_api.list_objects(repo, ref, after=after, amount=PAGE, **kwargs)
        assert page.pagination.max_per_page == 1000, page.pagination
        assert page.pagination.results == len(page.results), page.pagination
        objects.extend(page.results)
        pages += 1
        if not page.pagination.has_more:
            assert page.pagination.next_offset == "", page.pagination
            return objects
        after = page.pagination.next_offset
        assert after == page.results[-1].path, (after, page.results[-1].path)
        assert pages < 100, "pagination does not end"


def expect_status(status: int, call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except ApiException as e:
        assert e.status == status, (e.status, e.body)
        return e
    raise AssertionError(f"expected HTTP {status} from {call.__name__}")


def main() -> int:
    key = os.environ["LAKEFS_ACCESS_KEY_ID"]
    secret = os.environ["LAKEFS_SECRET_ACCESS_KEY"]
    try:
        client(key, "wrong").repositories_api.list_repositories()
        raise AssertionError("wrong secret accepted")
    except UnauthorizedException as e:
        assert "error authenticating request" in e.body, e.body
    clt = client(key, secret)
    clt.health_check_api.health_check()
    assert clt.config_api.get_config().storage_config.pre_sign_support is False
    assert clt.auth_api.get_current_user().user.id

    # 1. repository
    repo = "conformance-" + uuid.uuid4().hex[:8]
    created = clt.repositories_api.create_repository(
        RepositoryCreation(name=repo, storage_namespace=f"mem://conformance/{repo}", default_branch="main")
    )
    assert created.id == repo and created.default_branch == "main", created
    assert any(r.id == repo for r in clt.repositories_api.list_repositories().results)
    assert clt.repositories_api.get_repository(repo).storage_namespace == f"mem://conformance/{repo}"
    log(f"repository {repo} created")

    # 2. objects: uploaded to main (staged), listed page by page, read back
    for i in range(OBJECTS):
        clt.objects_api.upload_object(repo, "main", f"data/{i:04d}.txt", content=f"object {i}".encode())
    odd = "dir/a b+c/ü.txt"
    stats = clt.objects_api.upload_object(repo, "main", odd, content=b"hello")
    assert stats.path == odd and stats.size_bytes == 5, stats
    assert stats.checksum == "5d41402abc4b2a76b9719d911017c592", stats  # md5("hello")
    empty = clt.objects_api.upload_object(repo, "main", "dir/empty", content=b"")
    assert empty.size_bytes == 0 and empty.content_type == "application/octet-stream", empty
    listed = list_all(clt, repo, "main", prefix="data/")
    assert [o.path for o in listed] == [f"data/{i:04d}.txt" for i in range(OBJECTS)], len(listed)
    default_page = clt.objects_api.list_objects(repo, "main")
    assert len(default_page.results) == 100 and default_page.pagination.has_more
    top = clt.objects_api.list_objects(repo, "main", delimiter="/")
    assert [(o.path, o.path_type) for o in top.results] == [("data/", "common_prefix"), ("dir/", "common_prefix")], top
    assert bytes(clt.objects_api.get_object(repo, "main", odd)) == b"hello"
    assert clt.objects_api.stat_object(repo, "main", odd).checksum == stats.checksum
    log(f"{OBJECTS + 2} objects uploaded and listed in pages of {PAGE}")

    # 3. commit with metadata; branch from the commit id; change things; merge
    commit = clt.commits_api.commit(
        repo, "main", CommitCreation(message="initial data", metadata={"task": "t1", "worker": "w"})
    )
    assert commit.metadata == {"task": "t1", "worker": "w"}, commit
    assert clt.commits_api.get_commit(repo, commit.id).message == "initial data"
    assert clt.branches_api.get_branch(repo, "main").commit_id == commit.id
    expect_status(400, clt.commits_api.commit, repo, "main", CommitCreation(message="nothing"))
    head = clt.branches_api.create_branch(repo, BranchCreation(name="perago-staging-1", source=commit.id))
    assert head == commit.id, head
    clt.objects_api.upload_object(repo, "perago-staging-1", "data/0000.txt", content=b"changed")
    clt.objects_api.upload_object(repo, "perago-staging-1", "new/file.bin", content=b"\x00\x01")
    clt.objects_api.delete_object(repo, "perago-staging-1", "data/0001.txt")
    staged = clt.branches_api.diff_branch(repo, "perago-staging-1")
    assert sorted((d.path, d.type) for d in staged.results) == [
        ("data/0000.txt", "changed"), ("data/0001.txt", "removed"), ("new/file.bin", "added")
    ], staged
    # Uncommitted changes are visible on the branch, not on main.
    assert bytes(clt.objects_api.get_object(repo, "perago-staging-1", "data/0000.txt")) == b"changed"
    expect_status(404, clt.objects_api.stat_object, repo, "main", "new/file.bin")
    staging_commit = clt.commits_api.commit(
        repo, "perago-staging-1", CommitCreation(message="task output", metadata={"execution_id": "1"})
    )
    diff = clt.refs_api.diff_refs(repo, "main", "perago-staging-1")
    assert len(diff.results) == 3, diff
    # Meanwhile main moves on another path: no conflict.
    clt.objects_api.upload_object(repo, "main", "other/x", content=b"x")
    clt.commits_api.commit(repo, "main", CommitCreation(message="someone else"))
    merged = clt.refs_api.merge_into_branch(
        repo, "perago-staging-1", "main", merge=Merge(message="publish", metadata={"execution_id": "1"})
    )
    assert len(merged.reference) == 64, merged
    merge_commit = clt.commits_api.get_commit(repo, merged.reference)
    assert staging_commit.id in merge_commit.parents and len(merge_commit.parents) == 2, merge_commit
    assert merge_commit.metadata["execution_id"] == "1", merge_commit
    assert bytes(clt.objects_api.get_object(repo, "main", "data/0000.txt")) == b"changed"
    assert bytes(clt.objects_api.get_object(repo, "main", "other/x")) == b"x"
    expect_status(404, clt.objects_api.get_object, repo, "main", "data/0001.txt")
    log(f"merged {merged.reference}")

    # 4. conflict: both sides change the same path since the merge base
    base = clt.branches_api.get_branch(repo, "main").commit_id
    clt.branches_api.create_branch(repo, BranchCreation(name="perago-staging-2", source=base))
    clt.objects_api.upload_object(repo, "perago-staging-2", "data/0002.txt", content=b"task says")
    clt.commits_api.commit(repo, "perago-staging-2", CommitCreation(message="task"))
    clt.objects_api.upload_object(repo, "main", "data/0002.txt", content=b"someone else says")
    clt.commits_api.commit(repo, "main", CommitCreation(message="concurrent"))
    main_before = clt.branches_api.get_branch(repo, "main").commit_id
    error = expect_status(409, clt.refs_api.merge_into_branch, repo, "perago-staging-2", "main", merge=Merge())
    assert clt.branches_api.get_branch(repo, "main").commit_id == main_before, "a conflict merged something"
    assert bytes(clt.objects_api.get_object(repo, "main", "data/0002.txt")) == b"someone else says"
    log(f"conflict reported: {error.status} {error.body}")

    # 5. deletes
    clt.objects_api.delete_object(repo, "main", "data/0003.txt")
    result = clt.objects_api.delete_objects(repo, "main", PathList(paths=[f"data/{i:04d}.txt" for i in range(4, 10)]))
    assert result.errors == [], result
    clt.commits_api.commit(repo, "main", CommitCreation(message="cleanup"))
    remaining = list_all(clt, repo, "main", prefix="data/")
    assert len(remaining) == OBJECTS - 8, len(remaining)
    for name in ("perago-staging-1", "perago-staging-2"):
        clt.branches_api.delete_branch(repo, name)
    try:
        clt.branches_api.get_branch(repo, "perago-staging-1")
        raise AssertionError("deleted branch still there")
    except NotFoundException:
        pass
    assert [b.id for b in clt.branches_api.list_branches(repo).results] == ["main"]
    clt.repositories_api.delete_repository(repo)
    log("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
