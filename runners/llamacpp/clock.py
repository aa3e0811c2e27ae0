"""Freeze llama-server's wall clock with libfaketime (LD_PRELOAD).

llama.cpp reads the process clock for `strftime_now` and for the `date_string`/`datetime` variables it
injects into every render. Each server gets its own timestamp file (FAKETIME_TIMESTAMP_FILE, re-read on every
clock read with FAKETIME_NO_CACHE), so one server serves cases with different `now` values without a restart.
The monotonic clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC): the server's timers and waits keep working.
"""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Optional

# Debian's `libfaketime` package, for machines that install it instead of the PyPI wheel.
SYSTEM_LIBRARY_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)


def find_libfaketime() -> Optional[Path]:
    """CHATGOLD_LIBFAKETIME, else the PyPI `libfaketime` package's bundled library, else the system's."""
    configured = os.environ.get("CHATGOLD_LIBFAKETIME")
    if configured:
        return Path(configured) if Path(configured).is_file() else None
    try:
        import libfaketime  # the PyPI package bundles a prebuilt libfaketime.so.1

        bundled = Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
        if bundled.is_file():
            return bundled
    except ImportError:
        pass
    for candidate in SYSTEM_LIBRARY_PATHS:
        if os.path.isfile(candidate):
            return Path(candidate)
    return None


def faketime_stamp(now: str) -> str:
    """The case clock as libfaketime's absolute (frozen) timestamp, in UTC.

    Sub-second digits are dropped: llama.cpp's clock-reading template functions work in whole seconds.
    """
    value = _dt.datetime.fromisoformat(now.replace("Z", "+00:00"))
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def clock_env(library: Path, stamp_file: Path) -> dict:
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME_TIMESTAMP_FILE": str(stamp_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "TZ": "UTC",
    }


def write_stamp(stamp_file: Path, stamp: str) -> None:
    temp = stamp_file.with_name(stamp_file.name + ".tmp")
    temp.write_text(stamp + "\n", encoding="ascii")
    os.replace(temp, stamp_file)  # the server never reads a half-written file
