"""1-minimality: the single reduction steps a reproducer must not survive, declared once.

A reproducer (template, conversation) is 1-minimal when no single step below, applied anywhere, gives a
candidate on which the engine still differs from the reference in the same way (signature.Symptom.keeps).
The steps are a registry (`SHRINKS`, filled by the `@shrink` decorator), each a generator of candidates one
step smaller than its input; the reducer's last pass (reduce.Reduction.onestep) applies them until none
keeps the difference, smallest candidate first, and `is_one_minimal` holds any reproducer to the same
registry by rendering every candidate on both sides.

Template steps work on the tree of the exact source (template.py): a node dropped, a block replaced by one
of its smaller forms, an expression one step simpler (a filter dropped, a path shortened: `tools[0].function`
-> `tools[0]`), text shortened, a macro call inlined. Data steps: a message dropped, tools or documents
dropped, a flag made false, a key dropped from any object, an item dropped from any list, a string
shortened, a null or boolean made "". A message keeps its role.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from conformance.explain import template as tpl

Candidate = tuple   # (template source, conversation dict)
_ALNUM = re.compile(r"[^\W_]+")
SHRINKS: dict = {}  # name -> (applies to "template" | "data", generator(source, conversation) -> candidates)


def shrink(name: str, kind: str) -> Callable:
    def register(function: Callable) -> Callable:
        SHRINKS[name] = (kind, function)
        return function
    return register


def size(source: str, conversation: dict) -> tuple:
    """Smaller is better: template lines, template characters, then the conversation's JSON length."""
    return (tpl.lines_of(source), len(source), len(json.dumps(conversation, ensure_ascii=False, sort_keys=True)))


# -- template steps ---------------------------------------------------------------------------------------
# A step yields (source, conversation) or (source, conversation, (old, new)): a literal shortened from `old` to
# `new`, which the printed difference may contain (the reducer then expects it renamed there).

def _tag_variants(source: str, variants_of: Callable) -> Iterator[tuple]:
    """Each output or statement tag (a block's opening tag included) replaced by each of its variants:
    yields (source, *extra) where extra is whatever the variant function gave beside the new tag."""
    from dataclasses import replace

    tree = tpl.build_tree(source)
    for path in tpl.all_paths(tree):
        node = tpl.node_at(tree, path)
        leaf = node.arms[0].tag if isinstance(node, tpl.Block) else node
        if leaf.kind not in ("output", "stmt"):
            continue
        for variant, *extra in variants_of(leaf):
            replacement = (replace(node, arms=(replace(node.arms[0], tag=variant),) + node.arms[1:]),) \
                if isinstance(node, tpl.Block) else (variant,)
            yield (tpl.source_of(tpl.replace_at(tree, path, replacement)), *extra)


@shrink("shorter-literal", "template")
def _shorter_literal(source: str, conversation: dict) -> Iterator[Candidate]:
    for candidate, old, new in _tag_variants(source, tpl.literal_variants):
        yield candidate, conversation, (old, new)


@shrink("drop-node", "template")
def _drop_node(source: str, conversation: dict) -> Iterator[Candidate]:
    tree = tpl.build_tree(source)
    for path in tpl.all_paths(tree):
        yield tpl.source_of(tpl.remove_paths(tree, [path])), conversation


@shrink("smaller-block", "template")
def _smaller_block(source: str, conversation: dict) -> Iterator[Candidate]:
    tree = tpl.build_tree(source)
    for path in tpl.all_paths(tree):
        node = tpl.node_at(tree, path)
        if isinstance(node, tpl.Block):
            for variant in tpl.block_variants(node):
                yield tpl.source_of(tpl.replace_at(tree, path, variant)), conversation


@shrink("simpler-expression", "template")
def _simpler_expression(source: str, conversation: dict) -> Iterator[Candidate]:
    for (candidate,) in _tag_variants(source, lambda leaf: ((v,) for v in tpl.expression_variants(leaf))):
        yield candidate, conversation


@shrink("shorter-text", "template")
def _shorter_text(source: str, conversation: dict) -> Iterator[Candidate]:
    from dataclasses import replace

    tree = tpl.build_tree(source)
    for path in tpl.all_paths(tree):
        node = tpl.node_at(tree, path)
        if not (isinstance(node, tpl.Leaf) and node.kind == "text"):
            continue
        texts = [v.text for v in tpl.text_variants(node)]
        if len(node.text) > 1:
            texts += [node.text[:len(node.text) // 2], node.text[1:], node.text[:-1]]
        for text in dict.fromkeys(texts):
            if text != node.text:
                yield (tpl.source_of(tpl.replace_at(tree, path, (replace(node, text=text),) if text else ())),
                       conversation, (node.text, text))


@shrink("inline-macro", "template")
def _inline_macro(source: str, conversation: dict) -> Iterator[Candidate]:
    for variant in tpl.inline_variants(tpl.build_tree(source)):
        yield tpl.source_of(variant), conversation


# -- data steps -------------------------------------------------------------------------------------------

@shrink("drop-message", "data")
def _drop_message(source: str, conversation: dict) -> Iterator[Candidate]:
    messages = conversation.get("messages") or []
    for index in range(len(messages)):
        yield source, {**conversation, "messages": messages[:index] + messages[index + 1:]}


@shrink("drop-field", "data")
def _drop_field(source: str, conversation: dict) -> Iterator[Candidate]:
    for name in ("tools", "documents"):
        if conversation.get(name) is not None:
            yield source, {**conversation, name: None}
    for flag in ("add_generation_prompt", "continue_final_message"):
        if conversation.get(flag):
            yield source, {**conversation, flag: False}


def _values(value, protect_role: bool) -> Iterator[tuple]:
    """(smaller value, rename or None) for every single key drop, item drop or string cut anywhere inside
    `value` (a string cut renames the string)."""
    if isinstance(value, dict):
        for key in value:
            if not (protect_role and key == "role"):
                yield {k: v for k, v in value.items() if k != key}, None
        for key, item in value.items():
            for smaller, rename in _values(item, False):
                yield {**value, key: smaller}, rename
    elif isinstance(value, list):
        for index in range(len(value)):
            yield value[:index] + value[index + 1:], None
        for index, item in enumerate(value):
            for smaller, rename in _values(item, False):
                yield value[:index] + [smaller] + value[index + 1:], rename
    elif value is None or isinstance(value, bool):
        # null, true and false stand for "some value" as "" does: a difference that needs only the field
        # present keeps with the shortest value, and one that needs null or a boolean (null content made "")
        # does not
        yield "", None
    elif isinstance(value, str) and value:
        for cut in dict.fromkeys(["", value[:1], value[:len(value) // 2], value[1:], value[:-1]]):
            if cut != value:
                yield cut, (value, cut)


@shrink("smaller-value", "data")
def _smaller_value(source: str, conversation: dict) -> Iterator[Candidate]:
    messages = conversation.get("messages") or []
    for index, message in enumerate(messages):
        for smaller, rename in _values(message, True):
            yield source, {**conversation, "messages": messages[:index] + [smaller] + messages[index + 1:]}, rename
    for name in ("tools", "documents", "kwargs"):
        value = conversation.get(name)
        if value:
            for smaller, rename in _values(value, False):
                yield source, {**conversation, name: smaller}, rename


def steps(template: bool = True) -> list:
    """The registered step names that apply (template steps only when the template is being reduced)."""
    return [name for name, (kind, _) in SHRINKS.items() if template or kind != "template"]


def _roots(source: str, conversation: dict) -> frozenset:
    return _cached_roots(source, frozenset(conversation.get("kwargs") or {}))


@functools.lru_cache(maxsize=4096)
def _cached_roots(source: str, kwargs: frozenset) -> frozenset:
    """The first names of the paths a template reads (a reduction asks for the same templates many times)."""
    from conformance.explain import cluster

    case = {"kwargs": dict.fromkeys(kwargs)}
    return frozenset(re.split(r"[.\[]", path, 1)[0] for path in cluster.read_paths(source, case))


def unbinds(source: str, candidate: str, conversation: dict, roots: Optional[set] = None) -> bool:
    """Whether a candidate template reads a name that `source` binds itself and the candidate no longer does
    (a `{% set x %}` block dropped, `x` still printed): it would show how the engines print an undefined name,
    a difference of its own, not the source's. `roots`: the source's, when already computed."""
    if candidate == source:
        return False
    given = set(conversation) | set(conversation.get("kwargs") or {})
    before = _roots(source, conversation) if roots is None else roots
    return bool(_roots(candidate, conversation) - before - given)


def candidates(source: str, conversation: dict, template: bool = True, parse: bool = True,
               only: Optional[str] = None) -> list:
    """Every candidate one registered step smaller than (source, conversation), smallest first, each once,
    as (size, step name, source, conversation, rename: (old, new) or None). `template`: include the template
    steps; `parse`: only candidates whose template parses (with the reference's tags); `only`: one step's
    candidates."""
    here = size(source, conversation)
    roots = _roots(source, conversation) if template else set()
    seen, out = set(), []
    for name, (kind, function) in SHRINKS.items():
        if (kind == "template" and not template) or (only is not None and name != only):
            continue
        for produced in function(source, conversation):
            candidate_source, candidate_conversation = produced[0], produced[1]
            rename = produced[2] if len(produced) > 2 else None
            key = (candidate_source, json.dumps(candidate_conversation, ensure_ascii=False))
            if key in seen:
                continue
            seen.add(key)
            measure = size(candidate_source, candidate_conversation)
            if measure >= here:
                continue
            if parse and kind == "template" and not tpl.parses(candidate_source):
                continue
            if kind == "template" and unbinds(source, candidate_source, conversation, roots):
                continue
            out.append((measure, name, candidate_source, candidate_conversation, rename))
    out.sort(key=lambda c: c[0])
    return out


@dataclass
class Verdict:
    minimal: bool
    candidates: int                   # candidates rendered
    kept: list                        # [(step name, template, conversation)] that still differ in the same way
    reason: str = ""                  # why the reproducer could not be checked (it no longer differs)

    def __bool__(self) -> bool:
        return self.minimal


def is_one_minimal(reproducer: dict, engine, reference=None, template: Optional[bool] = None) -> Verdict:
    """Whether a stored reproducer (a cause's `repro`: template, case, bos_token, eos_token) is 1-minimal for
    this engine: rendered as it is, it must differ from the reference, and no registered single step may keep
    that difference. `reference`: an open reference runner (default: `get_runner("hf")`, closed after).
    `template`: whether template steps apply (default: yes; an engine that renders the case the same with a
    template of plain text is held to its own output on template steps, see `keeps`)."""
    from conformance.explain.driver import render_pairs
    from conformance.explain.reduce import PROBE_TEMPLATE, _answer
    from conformance.explain.signature import compare
    from runners import get_runner
    from runners.base import Conversation, RenderRequest

    own = reference is None
    reference = reference or get_runner("hf")
    try:
        def request(source: str, conversation: dict) -> RenderRequest:
            return RenderRequest(source, Conversation.from_dict(conversation), reproducer.get("bos_token"),
                                 reproducer.get("eos_token"), "repro", "repro")

        source, conversation = reproducer["template"], _full(reproducer["case"])
        (ref, eng), (probe_ref, probe_eng) = render_pairs(
            reference, engine, [request(source, conversation), request(PROBE_TEMPLATE, conversation)])
        target = compare(ref, eng)
        if target is None or not target.differs:
            return Verdict(False, 0, [], f"it does not differ ({eng.kind} against {ref.kind})")
        ignores = _answer(eng) == _answer(probe_eng) and _answer(ref) != _answer(probe_ref)
        template = True if template is None else template
        listed = candidates(source, conversation, template=template, parse=tpl.parses(source))
        empties = [c for _, _, s, c, _ in listed if not s and source]
        pairs = render_pairs(reference, engine, [request(s, c) for _, _, s, c, _ in listed] +
                             [request(tpl.NEUTRAL_PREFIX, c) for c in empties])
        stand_ins = iter(pairs[len(listed):])
        kept = []
        for (_, name, s, c, rename), pair in zip(listed, pairs):
            if not s and source and empty_means_none(pair, next(stand_ins)):
                continue
            own = pair if ignores and c == conversation else None
            if keeps(compare(*pair), target, (ref, eng), rename, own=own):
                kept.append((name, s, c))
        return Verdict(not kept, len(listed), kept)
    finally:
        if own:
            reference.close()


def empty_means_none(pair: tuple, stand_in: tuple) -> bool:
    """Whether the engine takes an empty template for no template: its answer with the empty template (`pair`)
    is not its answer with `{{ '' }}` (`stand_in`), which prints as little in every Jinja engine. llama.cpp and
    Ollama put a format of their own in its place, so an empty candidate is another input there, not a smaller
    one: a reduction of a `developer` message printed as `system` would end at ChatML printed for an empty
    template, the same shape of difference and another mechanism."""
    return not _same_answer(pair[1], stand_in[1])


def keeps(symptom, target, pair: tuple, rename, own: Optional[tuple] = None) -> bool:
    """Whether a candidate's symptom keeps `target`, the symptom of `pair` (reference, engine outcomes). A
    candidate that renamed a literal (old -> new) keeps a difference of different bytes when its first edit
    is the target's first edit with the literal renamed in it.

    `own`: the candidate's (reference, engine) pair when the engine ignores the template (it renders the case
    the same with a template of plain text) and the candidate changed only the template. Its difference is
    the engine's own output, whatever the template: the candidate keeps it when the engine gives the same
    answer as in `pair` and the sides still differ in the same kind. The reference's side changes with every
    template, so its first edit cannot be held (a refusal, the reference's, still must be the same)."""
    from conformance.explain.signature import diverged
    from conformance.judge.status import Status

    if symptom is None:
        return False
    if own is not None and symptom.status == target.status == Status.DIVERGED and \
            _same_answer(own[1], pair[1]):
        return True
    if rename is None or target.status != Status.DIVERGED or not target.first:
        return symptom.keeps(target)
    if symptom.status != Status.DIVERGED:
        return False
    old, new = rename
    # The pair's texts with the literal renamed where they print it, diffed again: the difference expected.
    # Its first edit is found as the candidate's is (signature.diverged): the first edit of a whole-text diff
    # is not always the windowed, slid and word-widened edit a symptom holds.
    expected = diverged(pair[0].text.replace(old, new), pair[1].text.replace(old, new))
    if expected.first and symptom.first == expected.first:
        return True
    # A literal the engine transforms (escapes, case) is not printed as itself on the engine's side: the same
    # first edit, its letters and digits aside, is the same difference.
    if not symptom.first:
        return False
    # ...and a shortened literal may print fewer of the marks it printed: each side's marks a part of the
    # target's (in order), an insertion still an insertion, a deletion still a deletion.
    mine, theirs = _marks(symptom.first), _marks(target.first)
    return all(bool(m) == bool(t) and _subsequence(m, t) for m, t in zip(mine, theirs))


def _same_answer(a, b) -> bool:
    return (a.kind, getattr(a, "text", None), getattr(a, "message", None)) == \
        (b.kind, getattr(b, "text", None), getattr(b, "message", None))


def _subsequence(short: str, long_: str) -> bool:
    letters = iter(long_)
    return all(char in letters for char in short)


def _marks(edit: tuple) -> tuple:
    """An edit without its letters and digits, except a side that is only letters and digits."""
    return tuple(side if side.isalnum() else _ALNUM.sub("", side) for side in edit)


def _full(case: dict) -> dict:
    """A stored case with every conversation field present."""
    from conformance.explain.reduce import conversation_dict
    from runners.base import Conversation

    return conversation_dict(Conversation.from_dict(case))
