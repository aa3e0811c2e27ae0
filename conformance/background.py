"""Work on a background thread whose result, or error, the caller takes when it needs it."""
from __future__ import annotations

import threading
from typing import Callable, Optional


class Job:
    """work() on a thread of its own, started by start(); result() waits for it and re-raises its error."""

    def __init__(self, name: str, work: Callable):
        self._work = work
        self._value = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"chatgold-{name}", daemon=True)

    def start(self) -> "Job":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as exc:  # handed to whoever waits for the result
            self._error = exc
        finally:
            self._done.set()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value
