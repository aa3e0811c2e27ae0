"""Reductions cached on disk, so a second explanation of the same cells costs seconds.

Key: the engine's identity (name, version, and its `build` when a protocol-2 harness gives one), the
reference's, this reducer's version, and what was reduced (template, special tokens, conversation, the symptom
kept). A runner without a trustworthy identity (a command harness that gives no build) is not cached. Entries
live in ~/.cache/chatgold/explain/<aa>/<key>.json (CHATGOLD_CACHE moves the root); writes are atomic
(temporary file + rename), so concurrent writers never leave a partial entry; the directory is kept under a
size bound by dropping the least recently used entries.

The stages after reduction (which data owns a difference, which construct is the culprit, which causes are
one mechanism) render variants of every reproducer again; their outcomes are kept in a result store of their
own under explain/outcomes (conformance/render/store.py: by each runner's identity, the exact template and
the conversation), so a re-run answers them from disk. Confirmation never reads it: every cause's reproducer
is rendered again on both sides in every run.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Optional

from conformance.files import ENCODING_ERRORS, atomic_write

# Bump when reductions change in a way that makes old entries wrong or worse. 4: the conversation is keyed in
# its own key order (two cases that differ only in key order are different inputs: `tojson`, `items()`), and
# an empty engine output no longer reads as "the engine ignores the template". 5: slices are dropped when the
# difference does not need them. 6: the "ignores the template" probe renders a plain-text template, not an empty
# one (llama.cpp puts ChatML in place of an empty template). 15: an engine that ignores the template is shown the
# smallest template on which the reference differs from it (the whole template was kept). 16: a refusal where the
# reference refuses too is reduced past the reference's own refusal (signature.Symptom.keeps); a message's
# reasoning under one name, and a field left unbound, own a difference; an engine keying templates by their text
# is keyed as one that ignores the template. 17: a literal renamed in a candidate is held to the first edit
# found as the candidate's is; a null or a boolean in the conversation shrinks to "". 18: a transplanted hint's
# template is reduced further (it was kept whole: a macro that only carried a value stayed). 19: a reduction
# says whether the engine recognised the template by its text (Found.recognised), which takes two neutral
# variants to show, not one; an empty candidate template is refused where the engine takes it for no template
# (minimal.empty_means_none).
REDUCER_VERSION = 19
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
PRUNE_EVERY = 200   # writes between size checks


def default_directory() -> Path:
    base = os.environ.get("CHATGOLD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chatgold")
    return Path(base) / "explain"


def runner_identity(info: dict, builtin: bool = False, code: Optional[dict] = None) -> Optional[str]:
    """A runner's cache identity from its describe(), or None when it has none worth trusting: a builtin
    runner's version names its engine build; a command harness must give a `build` (protocol 2), the promise
    that its outcomes are a function of the build and the inputs. `code` is the runner's own identity() (the
    digest of its code and configuration the result store keys outcomes by): with it, a change to a runner's
    code (a product runner reproducing one more step) retires its cached reductions too."""
    name, version = info.get("name"), info.get("version")
    if not name or not version or version in ("unknown", "missing"):
        return None
    if not builtin and not info.get("build"):
        return None
    build = info.get("build")
    if code:
        from conformance.render.store import identity_digest

        build = {"build": build, "code": identity_digest(code)} if build else identity_digest(code)
    return json.dumps({"name": name, "version": version, "build": build}, sort_keys=True)


def code_identity(runner) -> Optional[dict]:
    """The runner's identity() (None when it has none or cannot say)."""
    try:
        return runner.identity()
    except Exception:  # an identity it cannot compute is no identity: the cache falls back to name and version
        return None


class ExplainCache:
    def __init__(self, directory: Optional[Path] = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = Path(directory) if directory else default_directory()
        self.max_bytes = max_bytes
        self._writes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def outcomes(self):
        """The result store of the stages after reduction (module docstring), bounded as the reductions are: a
        new one for each run, so its counters are that run's (opening one reads nothing)."""
        from conformance.render.store import ResultStore

        return ResultStore(self.directory / "outcomes", max_bytes=self.max_bytes, verbose=False)

    @staticmethod
    def key(engine: str, reference: str, request, symptom_key: str) -> str:
        digest = hashlib.sha256()
        parts = (str(REDUCER_VERSION), engine, reference, request.template, repr(request.bos_token),
                 repr(request.eos_token),
                 json.dumps(request.conversation.to_dict(), ensure_ascii=False), symptom_key)
        for part in parts:
            data = part.encode("utf-8", ENCODING_ERRORS)
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        return digest.hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> Optional[dict]:
        path = self._path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8", errors=ENCODING_ERRORS))
            os.utime(path)  # recently used: kept longest
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return data

    def put(self, key: str, value: dict) -> None:
        path = self._path(key)
        try:
            atomic_write(path, json.dumps(value, ensure_ascii=False).encode("utf-8", ENCODING_ERRORS))
        except OSError:
            return  # a cache that cannot be written costs time later, never a wrong answer
        with self._lock:
            self._writes += 1
            due = self._writes % PRUNE_EVERY == 0
        if due:
            self.prune()

    def prune(self) -> None:
        """Drop the least recently used entries until the cache is under 80% of its bound."""
        entries = []
        total = 0
        for path in self.directory.glob("*/*.json"):
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((stat.st_mtime, stat.st_size, path))
            total += stat.st_size
        if total <= self.max_bytes:
            return
        for _, size, path in sorted(entries):
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            if total <= self.max_bytes * 0.8:
                break
