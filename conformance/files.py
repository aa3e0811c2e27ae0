"""Files chatgold writes, at the bottom of the import graph: every module may import this, it imports no
other module of the project.

A write is atomic (a temporary file beside the target, then a rename), so a reader or a kill midway sees the
old file or the new one, never a partial one."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

# Text a template can legitimately emit includes lone surrogates smuggled in through JSON; its bytes are kept
# exact by encoding and decoding with this error handler everywhere (goldens, the result store, reports).
ENCODING_ERRORS = "surrogatepass"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once: os.umask is process-wide, reading it twice races with other threads
FILE_MODE = 0o666 & ~_UMASK  # mkstemp creates 0600; what chatgold writes are ordinary readable files
DIR_MODE = 0o777 & ~_UMASK   # and mkdtemp 0700


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose content appears at `path` in one step when the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_file(path) as handle:
        handle.write(data)
