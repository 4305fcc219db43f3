"""The Files API over a real store (SQLite, and PostgreSQL under `make test`): upload (multipart), list, describe,
read back, delete; `purpose` and the form checked; a file over CHOIR_MAX_FILE_BYTES a 413 while it streams in;
each API key sees its own files only; no store, no files."""

import json

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory
from tests.test_errors import error_of

PATH = "/v1/files"
LINES = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                             "body": {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}}
                            ).encode() + b"\n" for i in range(3))


def make_client(url, **settings) -> TestClient:
    app = create_app(Settings(served_model_name="fake-model", store_url=url, **settings),
                     engine_factory=fake_engine_factory(FakeEngine(max_model_len=1024)))
    return TestClient(app)


def upload(client, content=LINES, purpose="batch", name="in.jsonl", headers=None, **fields):
    return client.post(PATH, files={"file": (name, content, "application/jsonl")},
                       data={"purpose": purpose, **fields}, headers=headers)


@pytest.fixture
def client(store_url):
    with make_client(store_url) as client:
        yield client


def test_a_file_is_uploaded_described_read_back_listed_and_deleted(client):
    created = upload(client)
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["id"].startswith("file-") and body["object"] == "file" and body["bytes"] == len(LINES)
    assert body["filename"] == "in.jsonl" and body["purpose"] == "batch" and body["status"] == "processed"
    assert body["created_at"] > 0 and body["expires_at"] is None  # no CHOIR_STORE_TTL here: it lives until deleted
    assert client.get(f"{PATH}/{body['id']}").json() == body
    content = client.get(f"{PATH}/{body['id']}/content")
    assert content.status_code == 200 and content.content == LINES
    listed = client.get(PATH).json()
    assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == [body["id"]]
    assert listed["has_more"] is False and listed["first_id"] == listed["last_id"] == body["id"]
    deleted = client.delete(f"{PATH}/{body['id']}")
    assert deleted.status_code == 200 and deleted.json() == {"id": body["id"], "object": "file", "deleted": True}
    for gone in (client.get(f"{PATH}/{body['id']}"), client.get(f"{PATH}/{body['id']}/content"),
                 client.delete(f"{PATH}/{body['id']}")):
        assert "No file" in error_of(gone, 404, "file_id")


def test_a_page_of_files_newest_first_or_in_order(client):
    ids = [upload(client, name=f"f{i}.jsonl").json()["id"] for i in range(5)]
    newest = client.get(PATH, params={"limit": 2}).json()
    assert [f["id"] for f in newest["data"]] == ids[::-1][:2] and newest["has_more"] is True
    following = client.get(PATH, params={"limit": 2, "after": newest["last_id"]}).json()
    assert [f["id"] for f in following["data"]] == ids[::-1][2:4]
    oldest = client.get(PATH, params={"order": "asc", "after": ids[2]}).json()
    assert [f["id"] for f in oldest["data"]] == ids[3:] and oldest["has_more"] is False
    assert client.get(PATH, params={"purpose": "assistants"}).json()["data"] == []
    assert "limit" in error_of(client.get(PATH, params={"limit": 0}), 400, "limit")


def test_an_expiry_of_the_files_own(client):
    body = upload(client, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}).json()
    assert body["expires_at"] == body["created_at"] + 3600
    for fields, param in (({"expires_after[anchor]": "now", "expires_after[seconds]": "3600"}, "anchor"),
                          ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"}, "seconds"),
                          ({"expires_after[anchor]": "created_at"}, "seconds")):
        assert "expires_after" in error_of(upload(client, **fields), 400, f"expires_after.{param}")


def test_a_bad_upload_is_a_400_naming_the_field(client):
    assert "fine-tune" in error_of(upload(client, purpose="fine-tune"), 400, "purpose")
    assert "`file` is required" in error_of(client.post(PATH, data={"purpose": "batch"},
                                                        files={"other": ("x", b"x")}), 400, "file")
    assert client.post(PATH, json={"purpose": "batch"}).status_code == 415
    broken = client.post(PATH, content=b"--b\r\nnot a part",
                         headers={"content-type": "multipart/form-data; boundary=b"})
    assert "multipart" in error_of(broken, 400)


def test_a_file_over_the_limit_is_a_413_while_it_streams_in(store_url):
    with make_client(store_url, max_file_bytes=1000) as client:
        assert upload(client, content=b"x" * 1000).status_code == 200
        assert "CHOIR_MAX_FILE_BYTES" in error_of(upload(client, content=b"x" * 1001), 413, "file")

        def chunks():  # no Content-Length: found out while reading, a chunk at a time
            yield b"--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big\"\r\n\r\n"
            for _ in range(200):
                yield b"y" * 1024
        streamed = client.post(PATH, content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"})
        assert "CHOIR_MAX_FILE_BYTES" in error_of(streamed, 413, "file")
        assert [f["bytes"] for f in client.get(PATH).json()["data"]] == [1000]


def test_each_key_sees_its_own_files_only(store_url):
    with make_client(store_url, api_keys=("key-a", "key-b")) as client:
        a, b = ({"Authorization": f"Bearer {key}"} for key in ("key-a", "key-b"))
        file_id = upload(client, headers=a).json()["id"]
        assert client.get(f"{PATH}/{file_id}", headers=a).status_code == 200
        for answer in (client.get(f"{PATH}/{file_id}", headers=b), client.get(f"{PATH}/{file_id}/content", headers=b),
                       client.delete(f"{PATH}/{file_id}", headers=b)):
            error_of(answer, 404, "file_id")
        assert client.get(PATH, headers=b).json()["data"] == []
        assert client.get(PATH).status_code == 401


def test_no_store_no_files():
    with make_client(None) as client:
        assert "store" in error_of(upload(client), 400)
        assert "store" in error_of(client.get(PATH), 400)


def test_expired_files_are_not_listed_and_are_evicted(client):
    """An expired file takes no place in a page (the page is read past it), and is deleted on the next upload."""
    from sqlalchemy import func, select, update

    from choir.plugins.store.models import StoredFile

    files = client.app.state["store"].files
    ids = [upload(client, name=f"f{i}").json()["id"] for i in range(3)]

    async def expire(file_ids):
        async with files.session() as session:
            await session.execute(update(StoredFile).where(StoredFile.id.in_(file_ids)).values(expires_at=1))
            await session.commit()

    async def stored():
        async with files.session() as session:
            return await session.scalar(select(func.count()).select_from(StoredFile))

    client.blocking_portal.call(expire, ids[1:])
    page = client.get(PATH, params={"limit": 1}).json()
    assert [f["id"] for f in page["data"]] == [ids[0]] and page["has_more"] is False
    error_of(client.get(f"{PATH}/{ids[2]}"), 404, "file_id")
    files._evicted = 0.0
    upload(client)
    assert client.blocking_portal.call(stored) == 2


def test_an_odd_form_is_a_400_not_a_500(client):
    fields = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600\u00b2"}
    error_of(upload(client, **fields), 400, "expires_after.seconds")
    twice = client.post(PATH, files=[("file", ("a", b"a")), ("file", ("b", b"b"))], data={"purpose": "batch"})
    assert "twice" in error_of(twice, 400, "file")
    named = upload(client, name="n" * 600 + "\x00")
    assert named.status_code == 200 and named.json()["filename"] == "n" * 512
