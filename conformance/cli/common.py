"""What every `chatgold` subcommand shares: exit codes (defined once), the user-error type, progress."""
from __future__ import annotations

import os
import sys
import threading
import time

# Exit codes of every chatgold command (docs and `chatgold --help` list them).
EXIT_OK = 0        # done; for check: every cell as its runner's expectations say
EXIT_FAIL = 1      # done, and something is not as it should be (unexpected cells, orphans, failed goldens)
EXIT_USAGE = 2     # bad input: a missing or unreadable file, a bad argument (one line on stderr names it)
EXIT_RAISED = 3    # render: the template refused (its message on stderr)
EXIT_ERRORED = 4   # render: the runner failed
EXIT_SKIPPED = 5   # render: the runner skipped the cell
EXIT_INTERNAL = 70  # chatgold's own bug (EX_SOFTWARE): one line names it; CHATGOLD_DEBUG=1 shows the traceback
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = ("exit status: 0 ok; 1 something is not as it should be (e.g. unexpected cells); 2 bad input "
                   "(a missing file, a directory, input nested too deeply, a bad argument); render only: 3 the "
                   "template refused, 4 the runner failed, 5 the runner skipped the cell; 70 internal error; "
                   "130 interrupted")


class UserError(Exception):
    """Bad input from the user: printed as one clear line, exit status 2."""


# Seconds between progress lines when the output is not a terminal (a CI log); 0 turns them off.
PROGRESS_INTERVAL_ENV = "CHATGOLD_PROGRESS_INTERVAL"
PROGRESS_INTERVAL = 30.0


def progress_printer(label: str, stream=None, unit: str = "cells"):
    """A one-line progress bar on a terminal; elsewhere (a CI log) one line every PROGRESS_INTERVAL seconds
    ($CHATGOLD_PROGRESS_INTERVAL), so a long run is never silent: what it does, how far, the time left."""
    stream = stream or sys.stderr  # the current stderr, not the one at import (it may have been replaced)
    if not stream.isatty():
        return progress_lines(label, stream, unit)

    def show(done: int, total: int) -> None:
        if done == total or done % 50 == 0:
            width = 30
            filled = int(width * done / max(total, 1))
            stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            if done == total:
                stream.write("\n")
            stream.flush()
    return show


def progress_lines(label: str, stream, unit: str = "cells", interval: float = None):
    """The log form of progress: a ticker thread prints the latest count at a steady interval (a slow step, one
    reduction taking minutes, still gets its lines) until the count reaches its total."""
    if interval is None:
        try:
            interval = float(os.environ.get(PROGRESS_INTERVAL_ENV, PROGRESS_INTERVAL))
        except ValueError:
            interval = PROGRESS_INTERVAL
    if interval <= 0:
        return None
    state = {"done": 0, "total": 0, "started": time.monotonic(), "ticking": False, "finished": False,
             "printed": False}
    wake = threading.Event()
    caller = threading.current_thread()

    def line() -> str:
        done, total = state["done"], state["total"]
        elapsed = time.monotonic() - state["started"]
        left = (f", about {_clock(elapsed * (total - done) / done)} left" if 0 < done < total
                else ", done" if done >= total else "")
        share = f" ({100 * done // total}%)" if total else ""
        verb = {"cells": " rendered", "groups": " reduced"}.get(unit, "")
        return f"chatgold progress: {label}: {done}/{total} {unit}{verb}{share}, {_clock(elapsed)} elapsed{left}"

    lock = threading.Lock()  # one writer at a time, and never a tick after the final line

    def tick() -> None:
        while not wake.wait(interval):
            with lock:
                if state["finished"] or not caller.is_alive():
                    return
                state["printed"] = True
                stream.write(line() + "\n")
                stream.flush()

    def show(done: int, total: int) -> None:
        with lock:
            if not state["ticking"]:
                state["ticking"] = True
                threading.Thread(target=tick, name="chatgold-progress", daemon=True).start()
            state["done"], state["total"] = done, total
            if done >= total and not state["finished"]:
                state["finished"] = True
                wake.set()
                if state["printed"]:  # a run shorter than one interval stays silent
                    stream.write(line() + "\n")
                    stream.flush()
    return show


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"
