"""What every `chatgold` subcommand shares: exit codes (defined once), the user-error type, progress."""
from __future__ import annotations

import sys

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


def progress_printer(label: str, stream=None):
    """A one-line progress bar on a terminal; silent otherwise (CI logs stay readable)."""
    stream = stream or sys.stderr  # the current stderr, not the one at import (it may have been replaced)
    if not stream.isatty():
        return None

    def show(done: int, total: int) -> None:
        if done == total or done % 50 == 0:
            width = 30
            filled = int(width * done / max(total, 1))
            stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            if done == total:
                stream.write("\n")
            stream.flush()
    return show
