"""One coded-error base, one code -> exception table, every wire code in election/wire/codes.py."""

import ast
import pathlib

import pytest

from broker import BrokerError
from broker.api.client import ClientError, TaskNotFound, WaitTimeout
from broker.protocol import RequestError
from election.wire import CodedError, RemoteError, WireError, codes, error_for
from ledger import LedgerError
from ledger.client.bookie_errors import BookieError, LedgerFencedError, NoSuchEntry, Unvouched
from snapshots import SnapshotError
from snapshots.transfer import TransferError

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "cls, root",
    [
        (RequestError, BrokerError),
        (ClientError, BrokerError),
        (TaskNotFound, BrokerError),
        (BookieError, LedgerError),
        (LedgerFencedError, LedgerError),
        (NoSuchEntry, LedgerError),
        (Unvouched, LedgerError),
        (TransferError, SnapshotError),
    ],
)
def test_coded_errors_keep_their_package_root(cls, root):
    exc = cls("some_code", "some message")
    assert isinstance(exc, CodedError) and isinstance(exc, root)
    assert (exc.code, exc.message, str(exc)) == ("some_code", "some message", "some_code: some message")


def test_wire_errors_have_their_own_root():
    assert not issubclass(WireError, LedgerError) and not issubclass(RemoteError, LedgerError)
    assert issubclass(WireError, CodedError) and issubclass(RemoteError, CodedError)
    assert WireError(codes.E_MALFORMED, "x", rid=4).rid == 4


def test_wait_timeout_is_a_client_error_and_a_timeout():
    exc = WaitTimeout("t1", 1.0, {"state": "waiting"})
    assert isinstance(exc, ClientError) and isinstance(exc, TimeoutError)
    assert exc.code == codes.E_WAIT_TIMEOUT


@pytest.mark.parametrize(
    "root, code, expected",
    [
        (BookieError, codes.E_FENCED, LedgerFencedError),
        (BookieError, codes.E_NO_ENTRY, NoSuchEntry),
        (BookieError, codes.E_UNKNOWN, Unvouched),
        (BookieError, codes.E_BUSY, BookieError),
        (ClientError, codes.E_NO_SUCH_TASK, TaskNotFound),
        (ClientError, codes.E_INVALID_QUEUE, ClientError),
        # A code declared by one family never leaks into another.
        (ClientError, codes.E_FENCED, ClientError),
        (BookieError, codes.E_NO_SUCH_TASK, BookieError),
    ],
)
def test_error_for_picks_the_class_declared_for_the_code_within_the_root(root, code, expected):
    exc = error_for(root, code, "msg")
    assert type(exc) is expected and (exc.code, exc.message) == (code, "msg")


def _product_files():
    for pkg in ("election", "ledger", "broker", "snapshots"):
        yield from (ROOT / pkg).rglob("*.py")


def test_no_bare_string_codes_where_errors_are_built():
    """error_reply(...) and coded-error constructors name their code by a constant, never a literal."""
    builders = {
        "error_reply",
        "RequestError",
        "ClientError",
        "TransferError",
        "WireError",
        "RemoteError",
        "LedgerFencedError",
        "err",
    }
    found = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in builders:
                continue
            # error_reply(rid, code, ...) names the code second; the others first.
            index = 1 if name == "error_reply" else 0
            if len(node.args) > index and isinstance(node.args[index], ast.Constant):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_bare_string_codes_where_codes_are_compared():
    """``exc.code == ...`` and ``reply.get("error") == ...`` name the code by its constant."""
    words = {v for k, v in vars(codes).items() if k.startswith("E_")}
    found = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            text = " ".join(ast.unparse(side) for side in sides)
            if ("code" in text or "error" in text) and any(
                isinstance(side, ast.Constant) and side.value in words for side in sides
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_every_code_constant_is_defined_once():
    for path in _product_files():
        if path == ROOT / "election" / "wire" / "codes.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                assert not any(n.startswith("E_") for n in names), f"{path.relative_to(ROOT)} defines {names}"


def test_the_wire_sits_below_ledger_and_broker():
    from tests.support.source_graph import import_graph

    graph = import_graph()
    assert "ledger.wire" not in graph
    for module in ("election.wire", "election.wire.codes"):
        assert all(t.split(".")[0] == "election" for t in graph[module]), graph[module]
    # The broker answers and calls through election.wire: none of these climbs into ledger.
    for module in (
        "broker.protocol",
        "broker.server.request_loop",
        "broker.api.client",
        "broker.admin.status",
    ):
        assert not any(t.split(".")[0] == "ledger" for t in graph[module]), (module, graph[module])
