"""The HTTP API's pure parts: the code -> status table, request parsing, task JSON, the rate limiter, API keys."""

from __future__ import annotations

import base64

import pytest

from broker.admin.http_api import ApiRequestError
from broker.admin.http_api.limits import ApiLimits, RateLimiter
from broker.admin.http_api.parsing import (
    bearer_key,
    parse_list_query,
    parse_submit,
    parse_wait_timeout,
    task_json,
)
from broker.admin.http_api.statuses import (
    E_RATE_LIMITED,
    E_UNAUTHORIZED,
    STATUS_OF,
    is_retryable,
    status_of,
)
from election.secure.api_keys import ApiKeyRing, add_api_key, key_digest, parse_api_keys_file
from election.secure.keys import KeysError
from election.wire import codes
from tests.support.clock import FakeClock

pytestmark = pytest.mark.timeout(30)


def test_every_wire_code_a_client_sees_has_a_status_and_the_table_says_what_http_says():
    assert status_of(codes.E_NO_SUCH_TASK) == 404
    assert status_of(codes.E_FORBIDDEN) == 403
    assert status_of(E_UNAUTHORIZED) == 401
    assert status_of(E_RATE_LIMITED) == 429
    assert status_of(codes.E_OVERSIZED) == status_of(codes.E_PAYLOAD_TOO_LARGE) == 413
    assert status_of(codes.E_MALFORMED) == status_of(codes.E_BAD_REQUEST) == 400
    assert status_of(codes.E_BAD_STATE) == 409
    assert status_of(codes.E_UNAVAILABLE) == status_of(codes.E_NOT_LEADER) == 503
    assert status_of("a code nobody made") == 500
    assert (
        is_retryable(codes.E_UNAVAILABLE)
        and is_retryable(E_RATE_LIMITED)
        and not is_retryable(codes.E_BAD_STATE)
    )
    # Every code the table maps is defined once, with the others (the HTTP API's own included).
    wire = {v for k, v in vars(codes).items() if k.startswith("E_")}
    assert {c for c in STATUS_OF if c not in wire} == set()
    assert {codes.E_UNAUTHORIZED, codes.E_RATE_LIMITED, codes.E_NOT_FOUND, codes.E_METHOD_NOT_ALLOWED} <= set(
        STATUS_OF
    )
    assert all(100 <= s < 600 for s in STATUS_OF.values())


def _refused(body: bytes, code: str = codes.E_BAD_REQUEST) -> str:
    with pytest.raises(ApiRequestError) as refused:
        parse_submit(body, "mail")
    assert refused.value.code == code
    return refused.value.message


def test_a_submit_body_maps_to_client_submit_arguments():
    assert parse_submit(b'{"payload": "hi"}', "mail") == {"queue": "mail", "payload": b"hi"}
    body = (
        b'{"payload_b64": "'
        + base64.b64encode(b"\xff\x00").decode().encode()
        + b'", "key": "k", "priority": -3, '
        b'"delay": 1.5, "max_attempts": 4, "max_run": 30, "retry_backoff": 0, "retry_backoff_max": 60, "key2": null}'
    )
    assert "key2" in _refused(body)
    args = parse_submit(body.replace(b', "key2": null', b""), "mail")
    assert args == {
        "queue": "mail",
        "payload": b"\xff\x00",
        "key": "k",
        "priority": -3,
        "delay": 1.5,
        "max_attempts": 4,
        "max_run": 30.0,
        "retry_backoff": 0.0,
        "retry_backoff_max": 60.0,
    }
    assert parse_submit('{"payload": "été", "key": null}'.encode(), "mail")["payload"] == "été".encode()


@pytest.mark.parametrize(
    "body",
    [
        b"[1]",
        b'"text"',
        b"{}",
        b'{"payload": 1}',
        b'{"payload": "x", "payload_b64": "eA=="}',
        b'{"payload_b64": "***"}',
        b'{"payload": "x", "priority": "5"}',
        b'{"payload": "x", "priority": false}',
        b'{"payload": "x", "max_attempts": 0}',
        b'{"payload": "x", "max_attempts": 2.0}',
        b'{"payload": "x", "delay": -0.1}',
        b'{"payload": "x", "max_run": 0}',
        b'{"payload": "x", "delay": 1e400}',
        b'{"payload": "x", "key": ""}',
        b'{"payload": "\\ud800"}',
    ],
)
def test_wrong_types_and_values_are_bad_requests(body):
    assert _refused(body)


def test_bodies_that_are_not_json_are_malformed_and_queue_names_are_checked():
    for body in (b"", b"{", b"\xff", b"[" * 100_000):
        _refused(body, codes.E_MALFORMED)
    with pytest.raises(ApiRequestError) as refused:
        parse_submit(b'{"payload": "x"}', "no spaces")
    assert refused.value.code == codes.E_INVALID_QUEUE


def test_queries_of_the_listing_and_the_long_poll():
    assert parse_list_query({}) == {"limit": 100}
    assert parse_list_query({"queue": "mail", "state": "dead", "after": "c", "limit": "5"}) == {
        "queue": "mail",
        "state": "dead",
        "after": "c",
        "limit": 5,
    }
    assert parse_list_query({"queue": "", "after": ""}) == {"limit": 100}
    for query in ({"state": "lost"}, {"limit": "0"}, {"limit": "x"}, {"limit": "1001"}, {"sort": "id"}):
        with pytest.raises(ApiRequestError):
            parse_list_query(query)
    assert parse_wait_timeout({}, 60) == 60 and parse_wait_timeout({"timeout": "2.5"}, 60) == 2.5
    for query in ({"timeout": "61"}, {"timeout": "-1"}, {"timeout": "nan"}, {"timeout": "soon"}, {"t": "1"}):
        with pytest.raises(ApiRequestError):
            parse_wait_timeout(query, 60)


def test_the_bearer_key_of_an_authorization_header():
    assert bearer_key("Bearer fpk_abc") == "fpk_abc" and bearer_key("bearer  fpk_abc ") == "fpk_abc"
    for header in (None, "", "Bearer", "Basic abc", "fpk_abc"):
        with pytest.raises(ApiRequestError) as refused:
            bearer_key(header)
        assert refused.value.code == E_UNAUTHORIZED


def test_task_json_gives_text_when_utf8_and_base64_otherwise():
    doc = task_json({"id": "t", "state": "done", "payload": b"hi", "result": b"\xff", "error": None})
    assert doc == {
        "id": "t",
        "state": "done",
        "payload": "hi",
        "result_b64": "/w==",
        "error": None,
        "final": True,
    }
    assert task_json({"state": "waiting", "payload": b""})["final"] is False


def test_the_rate_limiter_allows_a_burst_then_the_rate_per_key():
    clock = FakeClock()
    limiter = RateLimiter(rate=2, burst=3, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)
    assert limiter.take("b") == 0.0  # each key its own bucket
    clock.advance(0.5)
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0
    assert RateLimiter(rate=0, burst=1, clock=clock).take("a") == 0.0  # off
    assert ApiLimits(rate=100).bucket_size == 200 and ApiLimits(rate=100, burst=5).bucket_size == 5
    with pytest.raises(Exception):
        ApiLimits(rate=-1).validate()


def test_api_keys_are_stored_as_hashes_and_looked_up_by_key(tmp_path):
    path = tmp_path / "api.keys"
    key = add_api_key(path, "producer", "shop")
    admin = add_api_key(path, "admin", "ops")
    text = path.read_text()
    assert key not in text and key_digest(key) in text and (path.stat().st_mode & 0o777) == 0o600
    ring = ApiKeyRing(path)
    assert ring.lookup(key).role == "producer" and ring.lookup(admin).name == "ops"
    assert ring.lookup("fpk_" + "A" * 43) is None and ring.lookup("short") is None
    with pytest.raises(KeysError):
        add_api_key(path, "admin", "shop")  # the name is taken
    with pytest.raises(KeysError):
        add_api_key(path, "broker", "member")
    for bad in ("producer shop", "king shop sha256:" + "0" * 64, "admin ops sha256:xyz"):
        with pytest.raises(KeysError, match="line 1"):
            parse_api_keys_file(bad)


def test_the_key_ring_reads_the_file_again_when_it_changes_and_keeps_the_keys_of_a_bad_one(tmp_path):
    path = tmp_path / "api.keys"
    first = add_api_key(path, "producer", "shop")
    clock = FakeClock()
    ring = ApiKeyRing(path, clock=clock)
    second = add_api_key(path, "worker", "thumbs")
    assert ring.lookup(second) is None  # not looked at again within a second
    clock.advance(1.1)
    assert ring.lookup(second).role == "worker"
    path.write_text(path.read_text() + "garbage line\n")
    clock.advance(1.1)
    assert ring.lookup(first).name == "shop" and ring.lookup(second).name == "thumbs"


def test_keys_new_api_appends_the_hash_and_hands_out_the_key_once(tmp_path):
    import json

    from click.testing import CliRunner

    from cli import main

    keys_file = tmp_path / "api.keys"
    runner = CliRunner()
    printed = runner.invoke(
        main,
        ["keys", "new", "--api", "shop", "--role", "producer", "--api-keys-file", str(keys_file), "--json"],
    )
    assert printed.exit_code == 0, printed.output
    key = json.loads(printed.output)["key"]
    assert ApiKeyRing(keys_file).lookup(key).role == "producer" and key not in keys_file.read_text()
    written = runner.invoke(
        main,
        [
            "keys",
            "new",
            "--api",
            "ops",
            "--role",
            "admin",
            "--api-keys-file",
            str(keys_file),
            "--out",
            str(tmp_path),
        ],
    )
    assert written.exit_code == 0, written.output
    key_file = tmp_path / "ops.apikey"
    assert (key_file.stat().st_mode & 0o777) == 0o600
    assert key_file.read_text().strip() not in written.output
    assert ApiKeyRing(keys_file).lookup(key_file.read_text().strip()).name == "ops"
    for args in (["--role", "broker"], ["--role", "admin", "--name", "x"]):
        refused = runner.invoke(main, ["keys", "new", "--api", "m", *args, "--api-keys-file", str(keys_file)])
        assert refused.exit_code == 2, refused.output


def test_submit_path_is_matched_as_starlette_matches_it():
    from broker.admin.http_api.app import submit_queue_of

    assert submit_queue_of("/v1/queues/mail/tasks") == "mail"
    for other in (
        "/v1/queues//tasks",
        "/v1/queues/a/b/tasks",
        "/v1/queues/mail/tasks/",
        "/v1/queues",
        "/v1/tasks",
    ):
        assert submit_queue_of(other) is None
