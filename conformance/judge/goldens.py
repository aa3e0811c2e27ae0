"""Byte-exact goldens: goldens/<template-id>/<case-id>.txt, or <case-id>.raised.txt for a reference refusal.

Only the reference runner produces goldens. Every write is atomic (temporary file + rename), so an update
killed midway leaves each golden either old or new, never partial. A cell whose golden changes kind (`.txt` <->
`.raised.txt`) changes in one step too, never showing both files or neither: the template's directory is
rebuilt beside it (hard links of every other file plus the new one) and the two directories are exchanged
atomically (renameat2 RENAME_EXCHANGE), see swap_kind. Readers look both names up in one directory (one
directory handle), so they see the old directory or the new one, never a mix.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from functools import cached_property
from typing import Callable, Iterable, NamedTuple, Optional

from conformance import repo_root
from conformance.files import DIR_MODE, ENCODING_ERRORS, FILE_MODE, atomic_write
from runners.base import Errored, Outcome, Raised, RefusalKind, Rendered, Skipped, refusal_of

META_FILE = "_meta.json"
RENDERED_SUFFIX = ".txt"
RAISED_SUFFIX = ".raised.txt"
CAPABILITIES_FILE = "capabilities.json"
PROPERTIES_FILE = "properties.json"
_UNREAD = object()  # a cache slot not filled yet (None is an answer: no golden)


def goldens_dir() -> Path:
    return repo_root() / "goldens"


class Refusal(NamedTuple):
    """A reference refusal as a golden stores it: "<ExceptionType>: <message>"."""

    kind: RefusalKind
    type_name: str  # "" when the text does not start with an exception type
    message: str    # for raise_exception, exactly the template's argument


def parse_refusal(text: str) -> Refusal:
    type_name, sep, message = text.partition(": ")
    if not sep or not type_name.isidentifier():
        return Refusal(RefusalKind.RENDER, "", text)
    return Refusal(refusal_of(type_name), type_name, message)


@dataclass(frozen=True)
class Golden:
    kind: str  # "rendered" or "raised"
    data: bytes

    @property
    def text(self) -> str:
        decoded = self._decoded
        return decoded if decoded is not None else self.data.decode("utf-8", ENCODING_ERRORS)  # raises

    @property
    def _decoded(self) -> Optional[str]:
        # Kept in the instance by hand: functools.cached_property takes a lock on every read in Python 3.11,
        # which cost more than the comparison it serves (once per cell per runner).
        cached = self.__dict__.get("_text", _UNREAD)  # not try/except: the first read of each golden misses
        if cached is not _UNREAD:
            return cached
        try:
            decoded = self.data.decode("utf-8", ENCODING_ERRORS)
        except UnicodeDecodeError:
            decoded = None
        self.__dict__["_text"] = decoded
        return decoded

    def as_rendered(self) -> Rendered:
        """The golden's text as an engine's Rendered outcome: one object, shared by every runner whose cell matches
        (outcomes are immutable)."""
        try:
            return self.__dict__["_rendered"]
        except KeyError:
            rendered = self.__dict__["_rendered"] = Rendered(self.text)
            return rendered

    def matches_text(self, text: str) -> bool:
        """Whether text's bytes are this golden's. Compared as text, decoded once for every runner judged
        against it (the encoding is one-to-one, so equal text is equal bytes), unless the bytes do not decode."""
        decoded = self._decoded
        if decoded is not None:
            return text == decoded
        return text.encode("utf-8", ENCODING_ERRORS) == self.data

    @property
    def raised(self) -> bool:
        return self.kind == "raised"

    @cached_property
    def refusal(self) -> Optional[Refusal]:
        """The reference's refusal, parsed once; None for a rendered golden."""
        return parse_refusal(self.text) if self.raised else None


def cell_paths(template_id: str, case_id: str, root: Optional[Path] = None) -> tuple[Path, Path]:
    base = (root or goldens_dir()) / template_id
    return base / f"{case_id}{RENDERED_SUFFIX}", base / f"{case_id}{RAISED_SUFFIX}"


def golden_bytes(outcome: Outcome) -> tuple[str, bytes]:
    if isinstance(outcome, Rendered):
        return "rendered", outcome.text.encode("utf-8", ENCODING_ERRORS)
    if isinstance(outcome, Raised):
        return "raised", outcome.message.encode("utf-8", ENCODING_ERRORS)
    raise ValueError(f"a {outcome.kind} outcome cannot be a golden")


_KINDS = (("rendered", RENDERED_SUFFIX), ("raised", RAISED_SUFFIX))
# Looks at a cell whose template directory a kind change exchanged meanwhile (swap_kind): three were too few on
# a loaded machine with a writer changing kinds hundreds of times a second (a reader found no golden).
READ_ATTEMPTS = 100


def read_golden(template_id: str, case_id: str, root: Optional[Path] = None) -> Optional[Golden]:
    # Plain strings and os-level opens: this runs once per cell per runner, so pathlib's cost showed. Both
    # names are looked up through one directory handle, so a kind change exchanged meanwhile (swap_kind)
    # shows either the old directory or the new one.
    directory = os.path.join(root or goldens_dir(), template_id)
    for _ in range(READ_ATTEMPTS):
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            for kind, suffix in _KINDS:
                try:
                    fd = os.open(case_id + suffix, os.O_RDONLY, dir_fd=dir_fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                with os.fdopen(fd, "rb") as handle:
                    return Golden(kind, handle.read())
            # Neither name: true absence, unless the directory was exchanged away while we looked.
            try:
                if os.stat(directory).st_ino == os.fstat(dir_fd).st_ino:
                    return None
            except FileNotFoundError:
                return None
        finally:
            os.close(dir_fd)
    # Never a false absence: a cell whose directory kept changing under every look is an error, not "no golden".
    raise OSError(f"{os.path.join(directory, case_id)}: the golden's directory changed during each of "
                  f"{READ_ATTEMPTS} reads (a writer changing kinds without pause?)")


class GoldenStore:
    """Goldens read once and then shared: the gate checks every runner against the same cells.

    Each template's directory is listed once, so a cell costs one open of the file that exists (not a failed
    open of the other variant). Safe to call from several threads (a race costs one duplicate read, never a
    wrong answer). Goldens written after a template's listing are not seen: a store lives for one check."""

    def __init__(self, root: Optional[Path] = None):
        self.root = root
        self._cache: dict = {}
        self._listings: dict = {}

    def __call__(self, template_id: str, case_id: str) -> Optional[Golden]:
        key = (template_id, case_id)
        golden = self._cache.get(key, _UNREAD)  # not try/except: in a first run every lookup misses
        if golden is _UNREAD:
            golden = self._cache[key] = self._read(template_id, case_id)
        return golden

    def _read(self, template_id: str, case_id: str) -> Optional[Golden]:
        listing = self._listings.get(template_id)
        if listing is None:
            # The folder's path made once a template, not once a cell (Path to str costs more than the read).
            directory = os.path.join(self.root or goldens_dir(), template_id)
            try:
                names = frozenset(os.listdir(directory))
            except (FileNotFoundError, NotADirectoryError):
                names = frozenset()
            listing = self._listings[template_id] = (directory + os.sep, names)
        prefix, names = listing
        for kind, suffix in (("rendered", RENDERED_SUFFIX), ("raised", RAISED_SUFFIX)):
            name = case_id + suffix
            if name in names:
                try:
                    return Golden(kind, _read_bytes(prefix + name))
                except (FileNotFoundError, NotADirectoryError):
                    continue
        return None


def _read_bytes(path: str) -> bytes:
    # os.open/os.read: a buffered file object per golden cost twice the reading itself.
    fd = os.open(path, os.O_RDONLY)
    try:
        chunk = os.read(fd, 1 << 16)
        if len(chunk) < 1 << 16:
            return chunk
        parts = [chunk]
        while chunk:
            chunk = os.read(fd, 1 << 20)
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def write_golden(template_id: str, case_id: str, outcome: Outcome, root: Optional[Path] = None) -> bool:
    """Store the reference outcome; returns True when anything on disk changed."""
    kind, data = golden_bytes(outcome)
    rendered, raised = cell_paths(template_id, case_id, root)
    target, other = (rendered, raised) if kind == "rendered" else (raised, rendered)
    if other.exists():
        swap_kind(other, target, data)
        return True
    if not target.exists() or target.read_bytes() != data:
        atomic_write(target, data)
        return True
    return False


# -- kind changes in one step -----------------------------------------------------------------------------

SWAP_MARK = ".swap-"  # staging directories: `.<template-id>.swap-XXXX` beside the template's directory
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two existing paths (Linux renameat2 RENAME_EXCHANGE). False where the system or the
    filesystem cannot."""
    function = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(a))


@contextmanager
def _directory_lock(directory: Path):
    """An exclusive flock on the goldens root: one kind change at a time (writers are one process each)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def swap_kind(old: Path, new: Path, data: bytes) -> None:
    """Replace the golden `old` by `new` (the cell's other kind, holding `data`) in one atomic step.

    The template's directory is rebuilt beside it as `.<template>.swap-XXXX` (a hard link of every file but
    `old`, plus `new` written and synced) and exchanged with it in one rename. A writer killed before the
    exchange leaves the old directory in place, after it the new one; either way the staging directory is left
    behind, hidden from readers, reported by the orphan check and removed by the next kind change or update
    (recover_swaps). Without RENAME_EXCHANGE (not Linux, or a filesystem without it) the exchange is two
    renames, and recover_swaps puts back a directory a kill left half-renamed."""
    directory = old.parent
    root = directory.parent
    with _directory_lock(root):
        recover_swaps(root)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{directory.name}{SWAP_MARK}"))
        try:
            os.chmod(staging, DIR_MODE)  # mkdtemp creates 0700
            for entry in os.scandir(directory):
                if entry.name != old.name and entry.is_file(follow_symlinks=False):
                    os.link(entry.path, staging / entry.name)
            fd = os.open(staging / new.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if not exchange(staging, directory):
                aside = staging.with_name(staging.name + ".old")
                os.rename(directory, aside)   # a kill here: recover_swaps renames it back
                os.rename(staging, directory)
                os.rename(aside, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def recover_swaps(root: Optional[Path] = None) -> list:
    """Finish what a killed swap_kind left: put back a template directory left renamed aside (fallback path),
    remove staging directories. Returns what it removed or restored."""
    root = Path(root or goldens_dir())
    done = []
    if not root.is_dir():
        return done
    for path in sorted(root.iterdir()):
        if not (path.name.startswith(".") and SWAP_MARK in path.name):
            continue
        if path.name.endswith(".old"):
            template = root / path.name[1:path.name.index(SWAP_MARK)]
            if not template.exists():
                os.rename(path, template)
                done.append(str(template))
                continue
        shutil.rmtree(path, ignore_errors=True)
        done.append(str(path))
    return done




def expected_paths(template_ids: Iterable[str], case_ids: Iterable[str], root: Optional[Path] = None) -> dict:
    """template dir -> allowed file names (both variants of every cell, plus the analysis goldens)."""
    case_ids = list(case_ids)
    names = {f"{c}{RENDERED_SUFFIX}" for c in case_ids} | {f"{c}{RAISED_SUFFIX}" for c in case_ids}
    names.update((CAPABILITIES_FILE, PROPERTIES_FILE))
    return {t: names for t in template_ids}


def find_orphans(template_ids: Iterable[str], case_ids: Iterable[str], root: Optional[Path] = None) -> list[Path]:
    """Golden files that no (template, case) pair produces, and stray files of interrupted writes."""
    root = root or goldens_dir()
    allowed = expected_paths(template_ids, case_ids, root)
    orphans = []
    if not root.exists():
        return orphans
    for child in sorted(root.iterdir()):
        if child.name == META_FILE:
            continue
        if not child.is_dir() or child.name not in allowed:
            orphans.append(child)
            continue
        names = allowed[child.name]
        present = os.listdir(child)  # names, not Path objects: the corpus has ~90k goldens
        listed = set(present)
        for name in sorted(present):
            # A cell is either rendered or raised: a second variant beside the first is stale.
            stale_raised = name.endswith(RAISED_SUFFIX) and name[:-len(RAISED_SUFFIX)] + RENDERED_SUFFIX in listed
            if name not in names or stale_raised:
                orphans.append(child / name)
    return orphans


def encode_record(record: dict) -> bytes:
    """An analysis golden (capabilities.json, properties.json) in canonical form."""
    return (json.dumps(record, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8", ENCODING_ERRORS)


def load_record(path: Path) -> Optional[dict]:
    """An analysis golden, or None when there is none; ValueError naming the file when it is not JSON."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8", errors=ENCODING_ERRORS))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def read_meta(root: Optional[Path] = None) -> dict:
    path = (root or goldens_dir()) / META_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def write_meta(meta: dict, root: Optional[Path] = None) -> None:
    path = (root or goldens_dir()) / META_FILE
    data = (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()
    if not path.exists() or path.read_bytes() != data:
        atomic_write(path, data)


@dataclass
class UpdateReport:
    cells: int = 0
    written: int = 0
    removed: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # (template, case, message)

    @property
    def ok(self) -> bool:
        return not self.failures


def update_goldens(corpus, cases, runner, root: Optional[Path] = None, prune: bool = True,
                   progress: Optional[Callable[[int, int], None]] = None, full: bool = True) -> UpdateReport:
    """Render every (template, case) through the reference runner and store the outcomes.

    A cell the reference cannot produce (runner error, skip) is a failure: no golden is written for it and
    the old one is kept. `full` means the selection is the whole matrix, so orphans may be pruned.
    """
    from conformance.judge.pipeline import iter_cells

    report = UpdateReport()
    root = root or goldens_dir()
    report.removed.extend(recover_swaps(root))
    cells = list(iter_cells(corpus, cases))
    total = len(cells)
    requests = [cell.request for cell in cells]
    for index, (cell, outcome) in enumerate(zip(cells, runner.render_many(requests)), 1):
        report.cells += 1
        if isinstance(outcome, (Errored, Skipped)):
            detail = outcome.message
            report.failures.append((cell.template.id, cell.case.id, f"{outcome.kind}: {detail}"))
        elif write_golden(cell.template.id, cell.case.id, outcome, root):
            report.written += 1
        if progress:
            progress(index, total)
    if prune and full:
        for orphan in find_orphans([t.id for t in corpus], [c.id for c in cases], root):
            if orphan.is_dir():
                import shutil

                shutil.rmtree(orphan)
            else:
                orphan.unlink()
            report.removed.append(str(orphan))
    return report


def reference_versions() -> dict:
    from runners.hf import transformers_versions

    return {**transformers_versions(), "python_runner": "runners.hf", "note": "goldens are byte-exact outputs of these versions"}
