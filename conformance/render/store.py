"""The result store: outcomes already rendered, filed under everything that decides them, read before rendering.

An outcome is a function of (the runner's identity: runners.base.Runner.identity(); the template's exact
bytes; the conversation with the special tokens; chatgold's semantics version), so it is stored under exactly
that and reused only under exactly that: an unchanged engine re-runs in seconds, and a change to one template
or one case renders only its cells. A runner without an identity is never cached. Errored outcomes (a crash,
a timeout, a missing engine) are never stored: a failure is asked again, never remembered.

Layout, under results_dir() (~/.cache/chatgold/results; $CHATGOLD_CACHE/results; $CHATGOLD_RESULTS_DIR):

    CHATGOLD-RESULT-STORE                     the marker: this folder is a result store chatgold made
    <identity digest>/identity.json          the identity, for `chatgold cache stats`
    <identity digest>/<template sha256>.pack  one pack per template: case key -> outcome
    <identity digest>/<digest>.judged         one per template id: its cells' judged results (judge/judged.py)
    <identity digest>/.lock                   serialises writers of this identity's packs

A pack (schema: conformance/schemas/result-pack.schema.json for its body) is a magic line, one JSON header line
naming its identity, template and the sha256 and length of the body, then the body: zlib-compressed, a JSON
index and the texts it points into.
Reading checks all of it; a pack that fails any check (truncated, flipped bits, wrong JSON, filed under the
wrong name) is corrupt: none of its outcomes is trusted, its cells are rendered again and the pack rewritten.
Writes are atomic (temporary file + rename) and, per identity, serialised by a lock file, so two runs writing
at once lose nothing. The store is bounded (max_bytes): the least recently used packs go first.

The store deletes only what it wrote: it uses a folder that is new, empty or holds its marker (an older store,
only identity folders, is adopted), and refuses any other (StoreUnusable: `check` then renders without a store
and says so; `cache prune|clear` stop with an error). Pruning and clearing remove pack files, the store's own
temporaries and identity folders left with nothing else; a file or folder the store did not make survives.
A pack is read only when it is a regular file of at most MAX_PACK_BYTES, opened without blocking (a FIFO or a
device in its place is corrupt, not a hang); a store that cannot be written (read-only, a file in its place)
is left for the rest of the run with a warning, never aborting it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import stat
import sys
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from conformance.files import ENCODING_ERRORS
from conformance.files import atomic_write as _atomic_write
from runners.base import (
    SEMANTICS_VERSION,
    Outcome,
    Raised,
    RefusalKind,
    Rendered,
    RenderRequest,
    Runner,
    Skipped,
    canonical_json,
)

FORMAT = 1
MAGIC = b"chatgold-results %d\n" % FORMAT
PACK_SUFFIX = ".pack"
# Beside a template's pack, the judged results of its cells (conformance/judge/judged.py): the store keeps, prunes
# and clears them with the packs; what they hold is the judge's business.
JUDGED_SUFFIX = ".judged"
IDENTITY_FILE = "identity.json"
LOCK_FILE = ".lock"
MARKER_FILE = "CHATGOLD-RESULT-STORE"
MARKER_TEXT = b"chatgold result store: chatgold deletes only its own packs here\n"
# One template's outcomes for one engine: a few MB in practice; anything larger is not a pack chatgold wrote.
MAX_PACK_BYTES = 256 * 1024**2
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_OWN_TEMPORARY = re.compile(r"\.(?:[0-9a-f]{64}\.(?:pack|judged)|identity\.json)\.[A-Za-z0-9_]+\.tmp\Z")
# A temporary older than this has no live writer: pruning removes it.
STALE_TEMPORARY_SECONDS = 3600.0
RESULTS_DIR_ENV = "CHATGOLD_RESULTS_DIR"
MAX_BYTES_ENV = "CHATGOLD_RESULTS_MAX_MB"
DEFAULT_MAX_BYTES = 2 * 1024**3
# A pack read is recorded as a use (its mtime, for pruning) at most this often.
TOUCH_SECONDS = 3600.0
CAPABILITIES_PREFIX = "capabilities:"
ATTRIBUTION_PREFIX = "attribution:"
TOKENS_PREFIX = "tokens:"
PROPERTIES_PREFIX = "properties:"
# Entries beside the outcomes of a template's cells: key prefix -> record kind (a [kind, JSON object] pair).


def results_dir() -> Path:
    configured = os.environ.get(RESULTS_DIR_ENV)
    if configured:
        return Path(configured)
    cache = os.environ.get("CHATGOLD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chatgold")
    return Path(cache) / "results"


def megabytes_to_bytes(value, what: str) -> int:
    """A size bound given in megabytes, as bytes; ValueError (a usage error) unless a finite number >= 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what}={value!r}: expected a finite number of megabytes, 0 or more")
    return int(number * 1024 * 1024)


def default_max_bytes() -> int:
    configured = os.environ.get(MAX_BYTES_ENV)
    if configured:
        return megabytes_to_bytes(configured, MAX_BYTES_ENV)
    return DEFAULT_MAX_BYTES


class StoreUnusable(ValueError):
    """The results folder is not one the store may use (a foreign non-empty folder, a file, unwritable)."""


def _is_digest(name: str) -> bool:
    return _DIGEST.match(name) is not None


def check_root(root: Path, create: bool) -> bool:
    """Whether root is a result store (True) or absent (False, unless create: then it is made one, marker
    first). StoreUnusable when it is anything else: a file, or a non-empty folder without the marker that is not
    an older store (identity folders only, then adopted)."""
    try:
        info = os.stat(root)
    except FileNotFoundError:
        if not create:
            return False
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnusable(f"{root}: cannot create the result store ({exc.strerror or exc})") from None
        return check_root(root, create)
    except OSError as exc:
        raise StoreUnusable(f"{root}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StoreUnusable(f"{root}: not a folder (set {RESULTS_DIR_ENV} to a folder for the result store)")
    marker = root / MARKER_FILE
    if marker.is_file():
        return True
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise StoreUnusable(f"{root}: {exc.strerror or exc}") from None
    if not all(_is_digest(name) and (root / name).is_dir() and not (root / name).is_symlink() for name in names):
        raise StoreUnusable(f"{root}: a folder that is not empty and holds no {MARKER_FILE} file is not a result "
                            f"store; chatgold will not write or delete there (set {RESULTS_DIR_ENV} to a new or "
                            f"empty folder)")
    if not names and not create:
        return False  # an empty folder: made a store by the first write
    try:
        _atomic_write(marker, MARKER_TEXT)
    except OSError as exc:
        if names and not create:
            return True  # an older store on a read-only disk: readable as it is
        raise StoreUnusable(f"{root}: cannot write to the result store ({exc.strerror or exc})") from None
    return True


def read_regular(path, limit: int, what: str = "pack", head: Optional[int] = None) -> bytes:
    """The bytes of a regular file of at most limit bytes: opened without blocking (a FIFO never hangs), its
    type and size checked before reading (a device or an oversized file is refused, never read).
    FileNotFoundError when absent; OSError (with why) when refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file (a {_file_type(info.st_mode)})")
        if info.st_size > limit:
            raise OSError(f"{info.st_size} bytes, more than a {what} may hold ({limit})")
        chunks, left = [], limit + 1 if head is None else head
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if head is None and len(data) > limit:
            raise OSError(f"grew past {limit} bytes while read")
        return data
    finally:
        os.close(fd)


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "folder")):
        if test(mode):
            return name
    return "special file"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", ENCODING_ERRORS)).hexdigest()


def identity_digest(identity: dict) -> str:
    """The store's name for an identity: the identity with chatgold's semantics version and the store format."""
    return _sha256(canonical_json({"format": FORMAT, "semantics": SEMANTICS_VERSION, "identity": identity}))


def template_key(template: str) -> str:
    """sha256 of the template's exact bytes."""
    return _sha256(template)


def case_key(conversation, bos_token: Optional[str], eos_token: Optional[str],
             conversation_json: Optional[str] = None) -> str:
    """sha256 of the conversation (every field, runners.base.Conversation.to_dict) with the special tokens.
    conversation_json: the conversation's canonical JSON when the caller has it already (the same bytes)."""
    if conversation_json is None:
        conversation_json = canonical_json(conversation.to_dict())
    # canonical_json of {"bos_token", "conversation", "eos_token"} (sorted keys), composed around the
    # conversation's own canonical text: a corpus's templates pair each case with many token pairs.
    return _sha256(f'{{"bos_token":{canonical_json(bos_token)},"conversation":{conversation_json},'
                   f'"eos_token":{canonical_json(eos_token)}}}')


def capabilities_key(bos_token: Optional[str], eos_token: Optional[str]) -> str:
    return CAPABILITIES_PREFIX + _sha256(canonical_json({"bos_token": bos_token, "eos_token": eos_token}))


# -- outcome records: what a pack holds per case --------------------------------------------------------------

def cacheable(outcome: Outcome) -> bool:
    """Rendered, Raised and Skipped are answers about the template; Errored is the runner failing."""
    return isinstance(outcome, (Rendered, Raised, Skipped))


def to_record(outcome: Outcome) -> list:
    if isinstance(outcome, Rendered):
        return ["rendered", outcome.text]
    if isinstance(outcome, Raised):
        return ["raised", outcome.message, str(outcome.refusal)]
    if isinstance(outcome, Skipped):
        return ["skipped", outcome.message]
    raise ValueError(f"a {outcome.kind} outcome is never stored")


_REFUSALS = {str(kind): kind for kind in RefusalKind}


def side_record(record, kind: str) -> dict:
    """The JSON object a capabilities, attribution or tokens record holds; CorruptPack when it is not one."""
    if type(record) is list and len(record) == 2 and record[0] == kind and type(record[1]) is dict:
        return record[1]
    raise CorruptPack(f"not a {kind} record: {str(record)[:80]!r}")


class CorruptPack(ValueError):
    """A pack that fails a check: its outcomes are not used."""


_TEXT_KINDS = frozenset({"rendered", "raised", "skipped"})
_SIDE_KINDS = frozenset({"capabilities", "attribution", "tokens", "properties"})


def encode_pack(identity: str, template: str, entries: dict) -> bytes:
    """A pack of records (key -> ["rendered", text] | ["raised", message, kind] | ["skipped", message] |
    ["capabilities" | "attribution", object]). Its body is a JSON index (schema: result-pack.schema.json), a
    newline, then every text one after another, exactly (UTF-8, lone surrogates kept): the index gives each text
    by code point offsets, so reading a pack decodes its texts once instead of unescaping them from JSON."""
    index: dict = {}
    texts: list = []
    position = 0
    for key in sorted(entries):
        record = entries[key]
        if record[0] in _TEXT_KINDS:
            text = record[1]
            index[key] = [record[0], position, position + len(text), *record[2:]]
            texts.append(text)
            position += len(text)
        else:
            index[key] = list(record)
    raw = (json.dumps({"format": FORMAT, "entries": index}, ensure_ascii=True, separators=(",", ":"))
           + "\n" + "".join(texts)).encode("utf-8", ENCODING_ERRORS)
    body = zlib.compress(raw, 1)  # level 1: three times faster to write than 6, as fast to read
    header = {"identity": identity, "template": template, "entries": len(entries),
              "body": {"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body),
                       "encoding": "zlib: JSON index, newline, texts"}}
    return MAGIC + json.dumps(header, sort_keys=True).encode("ascii") + b"\n" + body


def _split_pack(data: bytes, identity: str, template: str) -> tuple:
    if not data.startswith(MAGIC):
        raise CorruptPack("not a result pack of this format (magic line)")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptPack("truncated header")
    try:
        header = json.loads(data[len(MAGIC):end])
        body_info = header["body"]
        digest, length = body_info["sha256"], body_info["bytes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptPack(f"unreadable header: {exc}") from None
    if header.get("identity") != identity or header.get("template") != template:
        raise CorruptPack("filed under another identity or template than it names")
    body = data[end + 1:]
    if len(body) != length:
        raise CorruptPack(f"body is {len(body)} bytes, the header says {length}")
    if hashlib.sha256(body).hexdigest() != digest:
        raise CorruptPack("body checksum mismatch")
    return header, body


def decode_pack(data: bytes, identity: str, template: str) -> dict:
    """key -> Outcome (case entries) or [kind, object] (side records), after every check (CorruptPack
    otherwise)."""
    header, body = _split_pack(data, identity, template)
    try:
        raw = zlib.decompress(body)
        newline = raw.index(b"\n")
        index = json.loads(raw[:newline])["entries"]
        texts = raw[newline + 1:].decode("utf-8", ENCODING_ERRORS)
    except (zlib.error, ValueError, KeyError, TypeError) as exc:
        raise CorruptPack(f"body does not decode: {exc}") from None
    if type(index) is not dict or len(index) != header.get("entries"):
        raise CorruptPack("body is not the announced number of entries")
    entries = {}
    size = len(texts)
    for key, item in index.items():
        if type(item) is not list or not item:
            raise CorruptPack(f"entry {key[:24]!r}: not a record")
        kind = item[0]
        side = key.partition(":")[0] if ":" in key else None
        if kind in _TEXT_KINDS and side is None:
            if len(item) != (4 if kind == "raised" else 3):
                raise CorruptPack(f"entry {key[:24]!r}: malformed {kind} record")
            start, end = item[1], item[2]
            if type(start) is not int or type(end) is not int or not 0 <= start <= end <= size:
                raise CorruptPack(f"entry {key[:24]!r}: text offsets out of range")
            if kind == "rendered":
                entries[key] = Rendered(texts[start:end])
            elif kind == "skipped":
                entries[key] = Skipped(texts[start:end])
            elif item[3] in _REFUSALS:
                entries[key] = Raised(texts[start:end], _REFUSALS[item[3]])
            else:
                raise CorruptPack(f"entry {key[:24]!r}: unknown refusal kind")
        elif kind == side and kind in _SIDE_KINDS and len(item) == 2:
            entries[key] = item
        else:
            raise CorruptPack(f"entry {key[:24]!r}: unknown record kind {str(kind)[:20]!r}")
    return entries


# -- the store --------------------------------------------------------------------------------------------------

@dataclass
class StoreCounters:
    hits: int = 0       # cells answered from the store
    rendered: int = 0   # cells cached_render_many had the runner render (not held, refreshed, or not cacheable)
    written: int = 0    # outcomes stored
    corrupt: list = field(default_factory=list)  # paths of packs that failed a check
    tokens_reused: int = 0  # token-parity verdicts read from the store
    tokens_asked: int = 0   # token-parity verdicts the engine was asked for

    def as_dict(self) -> dict:
        return {"hits": self.hits, "rendered": self.rendered, "written": self.written, "corrupt": len(self.corrupt),
                "tokens_reused": self.tokens_reused, "tokens_asked": self.tokens_asked}


class ResultStore:
    """Packs of outcomes on disk (module docstring). Safe to share between threads and processes."""

    def __init__(self, root: Optional[Path] = None, max_bytes: Optional[int] = None, verbose: bool = True):
        self.root = Path(root) if root is not None else results_dir()
        self.max_bytes = max_bytes if max_bytes is not None else default_max_bytes()
        self.verbose = verbose
        self.counters = StoreCounters()
        self._lock = threading.Lock()
        self._bytes_written = 0
        self._distrusted: set = set()  # packs found corrupt, not merged into by the next write
        self._identities: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._root_ok = False  # the root was found (or made) a result store
        self.unusable: Optional[str] = None  # why this run goes without the store

    # the root ---------------------------------------------------------------------------------------------
    def _ready(self, create: bool) -> bool:
        """Whether the store may be used (its root is a result store, made one when create); when it may not,
        it is left for the rest of the run, said once."""
        if self._root_ok:
            return True
        if self.unusable is not None:
            return False
        try:
            found = check_root(self.root, create)
        except StoreUnusable as exc:
            self.give_up(str(exc))
            return False
        self._root_ok = found
        return True

    def give_up(self, why: str) -> None:
        with self._lock:
            if self.unusable is not None:
                return
            self.unusable = why
        print(f"chatgold: warning: result store: {why}; continuing without it (every cell is rendered, nothing "
              f"stored)", file=sys.stderr)

    def check_root(self) -> bool:
        """For commands that act on the store itself: whether it exists; StoreUnusable when it is not one."""
        return check_root(self.root, create=False)

    # keys -------------------------------------------------------------------------------------------------
    def identity_of(self, runner: Runner) -> Optional[tuple]:
        """(digest, identity) of a runner, asked once per runner object; None when it is not cacheable."""
        try:
            return self._identities[runner]
        except (KeyError, TypeError):
            pass
        try:
            identity = runner.identity()
        except Exception as exc:  # a runner that cannot say is rendered, never cached
            self._say(f"{getattr(runner, 'name', 'runner')}: no identity ({type(exc).__name__}: {exc}); not cached")
            identity = None
        found = (identity_digest(identity), identity) if identity is not None else None
        try:
            self._identities[runner] = found
        except TypeError:
            pass
        return found

    def _say(self, message: str) -> None:
        if self.verbose:
            print(f"chatgold: result store: {message}", file=sys.stderr)

    def pack_path(self, identity: str, template: str) -> Path:
        return self.root / identity / (template + PACK_SUFFIX)

    # reading ----------------------------------------------------------------------------------------------
    def read_pack(self, identity: str, template: str) -> dict:
        """A pack's entries; {} when there is none or it is corrupt (then said once, and counted)."""
        if not self._ready(create=False):
            return {}
        path = self.pack_path(identity, template)
        try:
            data = read_regular(path, MAX_PACK_BYTES)
            mtime = os.stat(path).st_mtime
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            self._corrupt(path, f"unreadable: {exc}")
            return {}
        try:
            entries = decode_pack(data, identity, template)
        except CorruptPack as exc:
            self._corrupt(path, str(exc))
            return {}
        if time.time() - mtime > TOUCH_SECONDS:
            try:
                os.utime(path)  # a use, for pruning
            except OSError:
                pass
        return entries

    def _corrupt(self, path: Path, why: str) -> None:
        with self._lock:
            self._distrusted.add(path)
            if str(path) in self.counters.corrupt:
                return
            self.counters.corrupt.append(str(path))
        self._say(f"{path}: corrupt ({why}); its cells are rendered again")

    def lookup(self, identity: str, requests: Sequence[RenderRequest], keys: Optional[list] = None) -> list:
        """Outcome or None (not stored) for every request, reading each template's pack once."""
        keys = keys if keys is not None else request_keys(requests)
        packs: dict = {}
        found: list = []
        for key in keys:
            if key is None:
                found.append(None)
                continue
            entries = packs.get(key[0])
            if entries is None:
                entries = packs[key[0]] = self.read_pack(identity, key[0])
            found.append(entries.get(key[1]))  # case keys never name side records (their keys have a prefix)
        hits = sum(outcome is not None for outcome in found)
        with self._lock:
            self.counters.hits += hits
        return found

    def count_reused(self, cells: int) -> None:
        """Cells answered from the store by other means than lookup (kept judged results)."""
        with self._lock:
            self.counters.hits += cells

    def count_rendered(self, cells: int) -> None:
        with self._lock:
            self.counters.rendered += cells

    def count_tokens(self, reused: int, asked: int) -> None:
        with self._lock:
            self.counters.tokens_reused += reused
            self.counters.tokens_asked += asked

    # writing ----------------------------------------------------------------------------------------------
    def write(self, identity: tuple, template: str, entries: dict) -> None:
        """Merge entries (case key -> record) into the template's pack, atomically, under the identity's lock."""
        if not entries or not self._ready(create=True):
            return
        try:
            data = self._write(identity, template, entries)
        except OSError as exc:  # read-only, full, replaced by a file: the run goes on without the store
            self.give_up(f"{self.root}: cannot write ({exc.strerror or exc})")
            return
        with self._lock:
            self.counters.written += len(entries)
            self._bytes_written += len(data)

    def _write(self, identity: tuple, template: str, entries: dict) -> bytes:
        digest, described = identity
        directory = self.root / digest
        directory.mkdir(exist_ok=True)
        info = directory / IDENTITY_FILE
        if not info.exists():
            _atomic_write(info, (json.dumps({"format": FORMAT, "semantics": SEMANTICS_VERSION,
                                             "identity": described}, indent=1, sort_keys=True) + "\n").encode())
        with open(directory / LOCK_FILE, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.pack_path(digest, template)
            merged = {} if path in self._distrusted else {  # nothing of a pack found corrupt is kept
                key: value if type(value) is list else to_record(value)
                for key, value in self.read_pack(digest, template).items()}
            merged.update(entries)
            data = encode_pack(digest, template, merged)
            _atomic_write(path, data)
            self._distrusted.discard(path)
        return data

    def record(self, identity: tuple, requests: Sequence[RenderRequest], outcomes: Sequence[Outcome],
               keys: Optional[list] = None) -> None:
        """Store the cacheable outcomes of these requests (one pack write per template)."""
        keys = keys if keys is not None else request_keys(requests)
        by_template: dict = {}
        for key, outcome in zip(keys, outcomes):
            if key is not None and cacheable(outcome):
                by_template.setdefault(key[0], {})[key[1]] = to_record(outcome)
        for template, entries in by_template.items():
            self.write(identity, template, entries)

    # capabilities (an engine's own view of a template, e.g. llama-server's /props) ---------------------------
    def capabilities(self, identity: tuple, template: str, bos_token, eos_token) -> Optional[dict]:
        return self.side(identity, template_key(template), capabilities_key(bos_token, eos_token), "capabilities")

    def side(self, identity: tuple, template: str, key: str, kind: str, entries: Optional[dict] = None):
        """A side record's object (capabilities, attribution), or None when absent or malformed (the pack is
        then corrupt: said, and rewritten by the next write)."""
        if entries is None:
            entries = self.read_pack(identity[0], template)
        record = entries.get(key)
        if record is None:
            return None
        try:
            return side_record(record, kind)
        except CorruptPack as exc:
            self._corrupt(self.pack_path(identity[0], template), str(exc))
            return None

    def record_capabilities(self, identity: tuple, template: str, bos_token, eos_token, caps: dict) -> None:
        self.write(identity, template_key(template), {capabilities_key(bos_token, eos_token): ["capabilities", caps]})

    def _identity_dirs(self) -> list:
        """The identity folders the store made (digest names, real folders); nothing else under the root."""
        if not self.check_root():
            return []
        return [Path(entry.path) for entry in os.scandir(self.root)
                if _is_digest(entry.name) and entry.is_dir(follow_symlinks=False)]

    # judged results (conformance/judge/judged.py) ------------------------------------------------------------
    def read_judged(self, identity: str, template: str) -> Optional[bytes]:
        """The bytes of a template's judged file, or None (absent, unreadable, not a regular file)."""
        if not self._ready(create=False):
            return None
        path = self.root / identity / (template + JUDGED_SUFFIX)
        try:
            data = read_regular(path, MAX_PACK_BYTES, "judged file")
            if time.time() - os.stat(path).st_mtime > TOUCH_SECONDS:
                os.utime(path)  # a use, for pruning (as a pack's)
        except OSError:
            return None
        return data

    def write_judged(self, identity: tuple, template: str, data: bytes) -> None:
        """Replace a template's judged file, atomically; a store that cannot be written is left as for packs."""
        if not self._ready(create=True):
            return
        try:
            directory = self.root / identity[0]
            directory.mkdir(exist_ok=True)
            _atomic_write(directory / (template + JUDGED_SUFFIX), data)
        except OSError as exc:
            self.give_up(f"{self.root}: cannot write ({exc.strerror or exc})")
            return
        with self._lock:
            self._bytes_written += len(data)

    # housekeeping -----------------------------------------------------------------------------------------
    def packs(self) -> list:
        """(path, size, mtime) of every pack (a digest-named file ending .pack in an identity folder); [] when
        there is no store or it is unusable."""
        return self._own_files((PACK_SUFFIX,))

    def _own_files(self, suffixes: tuple = (PACK_SUFFIX, JUDGED_SUFFIX)) -> list:
        """(path, size, mtime) of every file of the store's with one of these suffixes (a digest name)."""
        found = []
        if self.unusable is not None:
            return found
        try:
            directories = self._identity_dirs()
        except StoreUnusable:
            return found
        for directory in directories:
            for entry in os.scandir(directory):
                name = entry.name
                stem, dot, suffix = name.rpartition(".")
                if (dot and "." + suffix in suffixes and _is_digest(stem)
                        and not entry.is_dir(follow_symlinks=False)):  # a folder by that name is not the store's
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    found.append((Path(entry.path), info.st_size, info.st_mtime))
        return found

    def stats(self) -> dict:
        """Per identity: what it is, its packs, cells and bytes, when last used; and the totals."""
        self.check_root()
        identities: dict = {}
        for path, size, mtime in self._own_files():
            row = identities.setdefault(path.parent.name, {"packs": 0, "entries": 0, "bytes": 0, "judged": 0,
                                                           "last_used": 0.0})
            row["bytes"] += size
            row["last_used"] = max(row["last_used"], mtime)
            if path.suffix == JUDGED_SUFFIX:
                row["judged"] += 1
                continue
            row["packs"] += 1
            row["entries"] += _header_entries(path)
        for digest, row in identities.items():
            try:
                row["identity"] = json.loads(read_regular(self.root / digest / IDENTITY_FILE, 1 << 20,
                                                          "identity file"))["identity"]
            except (OSError, ValueError, KeyError, TypeError):
                row["identity"] = None
            row["last_used"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row["last_used"]))
        total = sum(row["bytes"] for row in identities.values())
        return {"root": str(self.root), "format": FORMAT, "semantics": SEMANTICS_VERSION, "bytes": total,
                "max_bytes": self.max_bytes, "packs": sum(r["packs"] for r in identities.values()),
                "entries": sum(r["entries"] for r in identities.values()), "identities": identities}

    def prune(self, max_bytes: Optional[int] = None) -> dict:
        """Remove the least recently used packs and judged files until the store holds at most max_bytes; then stale
        temporaries of the store's own and identity folders left with nothing else. StoreUnusable when the
        root is not a result store (nothing is removed)."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        self.check_root()
        packs = sorted(self._own_files(), key=lambda p: p[2])
        total = sum(size for _, size, _ in packs)
        removed = freed = 0
        for path, size, _ in packs:
            if total <= limit:
                break
            total -= size
            if _unlink(path):
                freed += size
                removed += 1
        self._tidy(time.time() - STALE_TEMPORARY_SECONDS)
        return {"removed_packs": removed, "freed_bytes": freed, "bytes": total, "max_bytes": limit}

    def _tidy(self, temporaries_before: float) -> None:
        """Remove the store's temporaries older than temporaries_before, and every identity folder holding
        nothing but its identity file and lock (rmdir: a folder holding anything else stays)."""
        for directory in self._identity_dirs():
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                if _OWN_TEMPORARY.match(name):
                    path = directory / name
                    try:
                        if os.lstat(path).st_mtime < temporaries_before:
                            _unlink(path)
                    except OSError:
                        pass
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            if names and set(names) <= {IDENTITY_FILE, LOCK_FILE}:
                for name in names:
                    _unlink(directory / name)
            try:
                os.rmdir(directory)
            except OSError:
                pass  # not empty: a pack written meanwhile, or something the store did not make

    def prune_if_needed(self) -> Optional[dict]:
        """After this process wrote anything: prune when the store has grown past its bound."""
        with self._lock:
            wrote, self._bytes_written = self._bytes_written, 0
        if not wrote or self.unusable is not None:
            return None
        if sum(size for _, size, _ in self._own_files()) <= self.max_bytes:
            return None
        try:
            return self.prune()
        except (StoreUnusable, OSError) as exc:
            self.give_up(f"cannot prune: {exc}")
            return None

    def clear(self) -> int:
        """Remove every pack, the store's temporaries and identity folders left empty; returns the number of
        packs removed. StoreUnusable when the root is not a result store (nothing is removed)."""
        self.check_root()
        count = 0
        for path, _, _ in self._own_files():
            removed = _unlink(path)
            count += removed and path.suffix == PACK_SUFFIX
        self._tidy(math.inf)
        return count


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _header_entries(path: Path) -> int:
    try:
        head = read_regular(path, MAX_PACK_BYTES, head=4096)
        end = head.find(b"\n", len(MAGIC))
        return int(json.loads(head[len(MAGIC):end])["entries"]) if head.startswith(MAGIC) and end > 0 else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


# -- keys of requests, computed once per distinct template and conversation ------------------------------------

class _KeyMemo:
    """Template and case keys by object identity: every cell of a selection shares its template's source string
    and its case's Conversation, so each is hashed once however many cells use it."""

    def __init__(self):
        self._templates: dict = {}
        self._cases: dict = {}
        self._conversations: dict = {}  # id -> (conversation, its canonical JSON)
        self._lock = threading.Lock()

    def template(self, source: str) -> str:
        try:
            return self._templates[source]
        except KeyError:
            pass
        key = template_key(source)
        with self._lock:
            if len(self._templates) > 10_000:
                self._templates.clear()
            self._templates[source] = key
        return key

    def case(self, request: RenderRequest) -> str:
        conversation = request.conversation
        memo = (id(conversation), request.bos_token, request.eos_token)
        found = self._cases.get(memo)
        if found is not None and found[0] is conversation:
            return found[1]
        text = self._conversations.get(id(conversation))
        if text is None or text[0] is not conversation:
            text = (conversation, canonical_json(conversation.to_dict()))
        key = case_key(conversation, request.bos_token, request.eos_token, text[1])
        with self._lock:
            if len(self._cases) > 100_000:
                self._cases.clear()
            if len(self._conversations) > 10_000:
                self._conversations.clear()
            self._cases[memo] = (conversation, key)
            self._conversations[id(conversation)] = text
        return key


_KEYS = _KeyMemo()


def request_key(request: RenderRequest) -> Optional[tuple]:
    """(template key, case key), or None for a request whose conversation is not JSON data."""
    try:
        return _KEYS.template(request.template), _KEYS.case(request)
    except (TypeError, ValueError):
        return None


def request_keys(requests: Iterable[RenderRequest]) -> list:
    return [request_key(request) for request in requests]


# -- the one read-before-render path -------------------------------------------------------------------------

def cached_render_many(runner: Runner, requests: Iterable[RenderRequest], store: Optional[ResultStore],
                       refresh: bool = False) -> Iterator[Outcome]:
    """runner.render_many(requests), answering from the store first: only the cells it does not hold are
    rendered (in one render_many call, so the engine still batches them), and their outcomes are stored
    template by template as they arrive. refresh: read nothing, render every cell, store what comes back.
    Without a store, or for a runner without an identity, this is runner.render_many(requests)."""
    requests = list(requests)
    identity = store.identity_of(runner) if store is not None and requests else None
    if identity is None:
        if store is not None:
            store.count_rendered(len(requests))
        yield from runner.render_many(requests)
        return
    keys = request_keys(requests)
    found = [None] * len(requests) if refresh else store.lookup(identity[0], requests, keys)
    misses = [index for index, outcome in enumerate(found) if outcome is None]
    if not misses:
        yield from found
        return
    store.count_rendered(len(misses))
    remaining: dict = {}
    for index in misses:
        if keys[index] is not None:
            remaining[keys[index][0]] = remaining.get(keys[index][0], 0) + 1
    pending: dict = {}
    rendered = iter(runner.render_many([requests[index] for index in misses]))
    try:
        for index, outcome in enumerate(found):
            if outcome is None:
                outcome = next(rendered)
                key = keys[index]
                if key is not None:
                    template, case = key
                    if cacheable(outcome):
                        pending.setdefault(template, {})[case] = to_record(outcome)
                    remaining[template] -= 1
                    if not remaining[template] and template in pending:
                        store.write(identity, template, pending.pop(template))
            yield outcome
    finally:
        close = getattr(rendered, "close", None)
        if close is not None:
            close()
        for template, entries in pending.items():  # a run cut short keeps what it rendered
            store.write(identity, template, entries)


class CachedRunner(Runner):
    """A runner whose renders (and engine capability answers) go through the result store first: for code that
    takes a runner (capability goldens, capability agreement, goldens update with refresh)."""

    def __init__(self, runner: Runner, store: Optional[ResultStore], refresh: bool = False):
        self.runner = runner
        self.store = store
        self.refresh = refresh

    def __getattr__(self, name):
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)

    # The reducer's hooks are the wrapped engine's (Runner declares defaults, so __getattr__ would not reach them).
    def scratch_space(self, folder, idle: int = 0):
        return self.runner.scratch_space(folder, idle=idle)

    def reduction_runner(self):
        return self.runner.reduction_runner()

    name = property(lambda self: self.runner.name)
    version = property(lambda self: self.runner.version)
    language = property(lambda self: self.runner.language)
    homepage = property(lambda self: self.runner.homepage)
    cost_hint = property(lambda self: self.runner.cost_hint)

    def render(self, request: RenderRequest) -> Outcome:
        return next(iter(cached_render_many(self.runner, [request], self.store, self.refresh)))

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        return cached_render_many(self.runner, requests, self.store, self.refresh)

    def describe(self) -> dict:
        return self.runner.describe()

    def identity(self) -> Optional[dict]:
        return self.runner.identity()

    def close(self) -> None:
        self.runner.close()

    def reports_capabilities(self) -> bool:
        return self.runner.reports_capabilities()

    def template_capabilities(self, template: str, bos_token: Optional[str],
                              eos_token: Optional[str]) -> Optional[dict]:
        identity = self.store.identity_of(self.runner) if self.store is not None else None
        if identity is not None and not self.refresh:
            caps = self.store.capabilities(identity, template, bos_token, eos_token)
            if caps is not None:
                return caps
        caps = self.runner.template_capabilities(template, bos_token, eos_token)
        # Only an answer is kept: None may be a passing failure to ask.
        if identity is not None and isinstance(caps, dict):
            self.store.record_capabilities(identity, template, bos_token, eos_token, caps)
        return caps


# -- attribution (which template line printed a golden's first differing byte) -----------------------------------

@lru_cache(maxsize=1)
def attribution_identity() -> tuple:
    """The evaluator's identity (its traced render decides the answer) and the attribution code's digest."""
    from runners.evaluator.runner import EvaluatorRunner

    code = hashlib.sha256((Path(__file__).parent.parent / "judge" / "attribution.py").read_bytes()).hexdigest()
    identity = {"name": "attribution", "evaluator": EvaluatorRunner().identity(), "code": code}
    return identity_digest(identity), identity


def cached_attributions(pending: list, store: ResultStore, attribute) -> None:
    """attribute(pending) for (CellResult, RenderRequest, Golden) triples, the store answering first: an
    attribution is a function of the evaluator, the cell, the golden's bytes and the offset. Only answers that
    name a line are kept (an unavailable one may be a passing failure)."""
    identity = attribution_identity()
    keyed, packs, missing = [], {}, []
    for item in pending:
        result, request, golden = item
        template = _KEYS.template(request.template)
        key = ATTRIBUTION_PREFIX + _sha256(f"{_KEYS.case(request)} {golden.kind} "
                                           f"{hashlib.sha256(golden.data).hexdigest()} {result.divergence.offset}")
        entries = packs.get(template)
        if entries is None:
            entries = packs[template] = store.read_pack(identity[0], template)
        answer = store.side(identity, template, key, "attribution", entries)
        if answer is not None:
            result.attribution = dict(answer)
        else:
            missing.append(item)
            keyed.append((template, key, result))
    if not missing:
        return
    attribute(missing)
    found: dict = {}
    for template, key, result in keyed:
        answer = result.attribution
        if isinstance(answer, dict) and "line" in answer:
            found.setdefault(template, {})[key] = ["attribution", answer]
    for template, entries in found.items():
        store.write(identity, template, entries)


def open_store(enabled: bool = True) -> Optional[ResultStore]:
    """The default store, or None when caching is off."""
    return ResultStore() if enabled else None


__all__ = ["ResultStore", "CachedRunner", "CorruptPack", "cached_render_many", "open_store", "results_dir",
           "identity_digest", "template_key", "case_key", "request_key", "cacheable"]
