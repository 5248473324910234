"""How the torchrun workers end: without interpreter teardown."""

from __future__ import annotations

import os
import sys


def exit_without_teardown() -> None:
    """Flush and leave with status 0, skipping interpreter teardown.

    At teardown the DDP Reducer and torch's ProcessGroupGloo are destroyed; the destructor can join
    a gloo thread that waits for the GIL the main thread holds (seen as a 300 s hang), or abort
    ("terminate called without an active exception", SIGABRT). Every report is written by now.

    Call it as the worker's last statement *inside* main(): when main() returns, its locals are
    freed, and the DDP Reducer held the last reference to the gloo group. py-spy of a hung rank
    (2026-12-04, torch 2.13.0): the main thread in `~Reducer` -> `~ProcessGroupGloo` ->
    `std::thread::join`, holding the GIL; the gloo thread it joins in `~AsyncAllgatherWork` ->
    `decref_pyobject`, waiting for the GIL. Exiting from inside main() frees nothing.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
