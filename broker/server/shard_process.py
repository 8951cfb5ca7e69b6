"""The process of a shard n > 0 as it sees itself: it dies with its broker, names its shard in its logs,
and serves under the broker id of the broker that started it.

Started by its broker (:mod:`broker.server.shard_children`, the command line of
:mod:`broker.server.shard_command`), such a process:

- asks Linux to SIGKILL it when its parent ends (``PR_SET_PDEATHSIG``), and stops at once if the
  parent already ended before it could ask. SIGKILL, not SIGTERM: the death of a broker is the
  death of its replica of every shard, as if they were one process (a SIGKILLed broker's shards
  it led fail over, none hands over in order), and the data lock of each child is free at once
  for the children of the broker's next start;
- names its shard in every log line: the logger name gets ``[shard n]``, so the lines it writes
  to its parent's stderr (or log file) say which shard spoke;
- reads its broker id from ``<parent data>/.broker.meta`` (waiting while the parent has not
  established it yet) and never registers one: the id is the broker's, and so is its entry
  under ``brokers/ids``;
- ignores SIGTERM once the interpreter exits: a cluster shutdown stops a shard's processes
  first and their brokers right after, and a broker's stop SIGTERMs its shard processes. One
  that finished its stop and is exiting must still exit 0: Python's finalization puts the
  default action back, so a late SIGTERM would end it by the signal instead.

Example::

    if not enter_shard_process(2):    # [shard 2] in the logs, dies with its broker (gone already: False)
        return 1
    identity = wait_for_identity("b1/shards/2", 2, "dev", stop_event, clock)
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Mapping

from broker import BrokerError
from broker.server.shard_command import PARENT_PID_ENV, parent_data_dir
from election.identity import META, BrokerIdentity, read_identity
from election.local.clock import Clock

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# How often a shard's process looks for its broker's id while the broker establishes it.
IDENTITY_POLL_S = 0.2


class ParentGone(BrokerError):
    """The broker that started this shard's process ended before the process could tie itself to it."""


def die_with_parent(environ: Mapping[str, str] = os.environ) -> None:
    """Be SIGKILLed when the thread that started us ends; ParentGone if our broker is gone already."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("cannot ask to die with the broker: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:  # not Linux: the broker's orderly stop still stops us
        log.warning("cannot ask to die with the broker: %s", exc)
    expected = environ.get(PARENT_PID_ENV)
    # Asked only now: a parent that died since it started us made us some other process's child.
    if expected and os.getppid() != int(expected):
        raise ParentGone(f"the broker (pid {expected}) that started this shard's process is gone")


def enter_shard_process(shard: int) -> bool:
    """Name ``shard`` in every log line and tie this process to its broker; False (logged) if the
    broker is gone already: then the process must not start."""
    name_logs_by_shard(shard)
    # Before the finalization resets the handlers: a SIGTERM from then on finds us exiting already.
    atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)
    try:
        die_with_parent()
    except ParentGone as exc:
        log.error("not starting: %s", exc)
        return False
    return True


def name_logs_by_shard(shard: int) -> None:
    """Every log record of this process names ``shard`` after its logger's name."""
    make_record = logging.getLogRecordFactory()

    def shard_record(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        record.name = f"{record.name}[shard {shard}]"
        return record

    logging.setLogRecordFactory(shard_record)


def wait_for_identity(
    data: str | Path, shard: int, cluster: str, stop: threading.Event, clock: Clock
) -> BrokerIdentity:
    """The broker id in the parent broker's data dir, once there (BrokerError if stopped first)."""
    parent = parent_data_dir(data, shard)
    said = False
    while not stop.is_set():
        identity = read_identity(parent, cluster)
        if identity is not None:
            return identity
        if not said:
            log.info("waiting for the broker to establish its id in %s", parent / META)
            said = True
        clock.wait(stop, IDENTITY_POLL_S)
    raise BrokerError(f"stopped while waiting for the broker id in {parent / META}")
