"""The check of a broker's state store after every start: until it passes, the broker does not stand.

A store closed in order is not verified when it opens (the orderly stop checked it), so a file
damaged while the broker was down would otherwise be followed, and led from, until the next
checkpoint read it. So after every start, and after every rebuild or snapshot install that
replaces the store while the broker runs, :class:`StoreVerification` checks the whole store
exactly as ``fencepost store verify`` does (:func:`~broker.server.store.guard.verify_store_dir`:
the seal of position and digest, every record hashed against the incremental digest, the
``by_state`` index against the tasks) and, until that has passed, :meth:`StoreVerification.hold`
keeps the broker out of the election (the candidacy's ``hold``; it is checked again on winning).

The check runs in a child process that opens the store read-only: one LMDB read transaction,
so the follower tail goes on applying meanwhile and the start is not slowed; the hashing does not
compete with the broker's threads for the interpreter; and a torn file that makes LMDB abort kills
the child, not the broker. A store found damaged is handed to the running store's repair
(:meth:`broker.server.store.running.RunningStore.damaged`: moved aside, rebuilt as when a
checkpoint finds damage), whose rebuilt store is verified in turn. A store the start already
verified in full (one not closed in order, :meth:`broker.server.store.keeper.StoreKeeper.verified`)
counts as verified. A single broker, or the only one in sync, therefore leads after a start
once the check has passed: 6.8 s for a million tasks on a shared 2-core machine (docs/operations.md).

The outcome of a child (:func:`child_outcome`) is decided by a pure function.

Example::

    check = StoreVerification(data / "state", damaged=running.damaged, passed=candidacy.poke,
                              stop=stop_event, clock=clock)
    check.begin("after its start")   # a thread runs the check
    check.hold()                     # "its state store is being verified" until it passed, then ""
    check.live_fields()              # {"store_check": "verifying" | "verified" | "damaged"}
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from broker.state.store_errors import StoreDamaged
from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

VERIFYING, VERIFIED, DAMAGED = "verifying", "verified", "damaged"
# Why the broker does not stand meanwhile (the candidacy logs it once: "not standing for election: ...").
HOLD_REASON = "its state store is being verified"
# How often the waiting thread looks whether the check was abandoned (a stop, a newer store).
POLL_S = 0.05
# A check that takes longer is taken for a store LMDB cannot read to the end.
CHECK_TIMEOUT_S = 3600.0

# Signals by which a reader of a torn LMDB file dies; any other (an operator's kill, the OOM killer)
# is no verdict on the store, and the check runs again.
TORN_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE})
# How long to wait before checking again after a check that gave no verdict.
RETRY_S = 1.0

# (report, problem): at most one is set; neither: no verdict (check again). None: the check was abandoned.
Outcome = tuple[dict | None, str | None]
Check = Callable[[Path, Callable[[], bool]], Outcome | None]


def child_outcome(returncode: int, stdout: bytes) -> Outcome:
    """What a checking child's exit says: its report (JSON, last line) if 0, why the store is damaged if it
    failed or died of a :data:`TORN_SIGNALS` signal, neither if it was killed from outside."""
    lines = stdout.decode(errors="replace").strip().splitlines()
    if returncode == 0:
        try:
            return json.loads(lines[-1]), None
        except (IndexError, ValueError):
            return None, "the checking process exited 0 without its report"
    if returncode < 0:
        if -returncode not in TORN_SIGNALS:
            return None, None
        name = signal.Signals(-returncode).name
        return None, f"reading it crashed the checking process ({name}): the file is torn"
    return None, lines[-1] if lines else f"the check failed (exit {returncode})"


class StoreVerification:
    """Whether the store served now has passed its check since it was opened (see the module docstring).

    ``damaged(StoreDamaged)`` and ``passed()`` are called on the checking thread; ``check`` (tests)
    replaces the child process: ``check(state_dir, abandoned) -> (report, problem)``, or None once
    ``abandoned()``.
    """

    def __init__(
        self,
        state_dir: Path,
        damaged: Callable[[StoreDamaged], None],
        passed: Callable[[], None],
        stop: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
        check: Check | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.damaged, self.passed, self.stop, self.clock = damaged, passed, stop, clock
        self.check = check or self._check_in_child
        self._lock = threading.Lock()
        self._generation = 0
        self.state = VERIFYING  # the gate is closed until a check of the current store passed
        self.seconds: float | None = None  # how long the last check that ended took
        self._child: subprocess.Popen | None = None

    def hold(self) -> str:
        """Why not to stand for election now ("" once the current store passed its check)."""
        return "" if self.state == VERIFIED else HOLD_REASON

    def live_fields(self) -> dict:
        """For the live node: the state of the check (an additive field; older readers ignore it)."""
        return {"store_check": self.state}

    def verified_at_open(self, report: dict) -> None:
        """The start verified this store in full before serving it (it was not closed in order)."""
        with self._lock:
            self._generation += 1
            self.state, self.seconds = VERIFIED, 0.0
        log.info(
            "the state store was verified as it opened (%d records): may stand for election",
            report["records"],
        )
        self.passed()

    def abandon(self) -> None:
        """The store is about to be replaced: close the gate, and let no check still running decide."""
        with self._lock:
            self._generation += 1
            self.state = VERIFYING

    def close(self) -> None:
        """The broker stops: abandon the check and end its child now (it would outlive us otherwise)."""
        self.abandon()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()

    def begin(self, when: str) -> None:
        """Check the store now in ``state_dir`` (``when``: "after its start", ...); the gate closes until
        it passes, and a check of a store it replaced is abandoned."""
        with self._lock:
            self._generation += 1
            generation, self.state = self._generation, VERIFYING
        log.info(
            "verifying the state store %s in the background: not standing for election until it passes", when
        )
        threading.Thread(target=self._run, args=(generation,), name="store-verify", daemon=True).start()

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self.stop.is_set()

    def _run(self, generation: int) -> None:
        started = self.clock.monotonic()
        outcome = self.check(self.state_dir, lambda: not self._current(generation))
        while outcome == (None, None) and self._current(generation):
            log.warning("the check of the state store was killed from outside: checking it again")
            self.clock.wait(self.stop, RETRY_S)
            outcome = self.check(self.state_dir, lambda: not self._current(generation))
        seconds = self.clock.monotonic() - started
        with self._lock:
            if outcome is None or outcome == (None, None) or not self._current(generation):
                return  # stopping, or the store was replaced meanwhile: its own check decides
            report, problem = outcome
            self.state, self.seconds = (VERIFIED if problem is None else DAMAGED), seconds
        if problem is not None:
            self.damaged(StoreDamaged(self.state_dir, problem))
            return
        log.info(
            "state store verified in %.2fs: %d records at %s hash to %s; may stand for election",
            seconds,
            report["records"],
            report["position"],
            report["digest"],
        )
        self.passed()

    def _check_in_child(self, state_dir: Path, abandoned: Callable[[], bool]) -> Outcome | None:
        """Run ``python -m`` this module on ``state_dir``; kill it once ``abandoned()``."""
        # Its own session: a signal to the broker's process group (a stop) is not the child's death,
        # which would read as a verdict; the broker kills it when it stops.
        child = subprocess.Popen(
            [sys.executable, "-m", __name__, str(state_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._child = child
        deadline = self.clock.monotonic() + CHECK_TIMEOUT_S
        try:
            while child.poll() is None:
                if abandoned():
                    return None
                if self.clock.monotonic() > deadline:
                    return None, f"checking it took longer than {CHECK_TIMEOUT_S:.0f} s"
                self.clock.wait(self.stop, POLL_S)
            return child_outcome(child.returncode, child.stdout.read())
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
            child.stdout.close()


def _child(state_dir: str) -> int:
    """The checking child: ``fencepost store verify``'s check; its report as JSON, or the reason (exit 1)."""
    from broker.server.store.guard import verify_store_dir

    try:
        report = verify_store_dir(Path(state_dir))
    except StoreDamaged as exc:
        print(exc.reason)
        return 1
    except Exception as exc:  # whatever a damaged file makes the reader raise: it is the answer
        print(f"{type(exc).__name__}: {exc}")
        return 1
    print(json.dumps({k: report[k] for k in ("records", "position", "digest")}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
