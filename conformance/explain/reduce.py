"""Delta debugging of one (template, case) pair down to a minimal pair that still differs in the same way.

A `Reduction` is a coroutine: `run()` yields lists of RenderRequests and is sent back, for each, the pair
(reference outcome, engine outcome). It never renders anything itself, so one driver can interleave many
reductions and hand both runners one batch at a time (conformance/explain/driver.py). Every accepted step is
a real render through both runners whose symptom keeps the original's (signature.Symptom.keeps).

Passes, repeated while they still shrink something (each bounded by the render budget):
  case        drop messages; drop tools, documents, kwargs; add_generation_prompt and
              continue_final_message false; drop keys and list items inside every value; shorten strings
  hint        a reproducer found for a similar template, transplanted (its segments kept, the rest dropped)
  coverage    render once with a marker at the start of every block arm; drop the arms that ran on neither
              side (one candidate)
  hdd         hierarchical delta debugging: ddmin over the nodes of each nesting level, outermost first
  blocks      a block replaced by one arm's body (tags dropped), an arm dropped, `elif` promoted to `if`
  expressions an expression inside a tag made one step simpler (a filter dropped, an operand kept, a
              condition made constant, an argument dropped)
  text        lines and words dropped from text between tags
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Generator, Optional, Sequence

from conformance.explain import cluster, minimal
from conformance.explain import template as tpl
from conformance.explain.signature import Symptom, compare
from conformance.judge.status import Status
from runners.base import Conversation, Outcome, RenderRequest

DEFAULT_BUDGET = 1500   # candidate renders (each through both runners) one reduction may spend
MAX_ROUNDS = 4
# ddmin stops refining past this many chunks: a long list none of whose parts can go would otherwise cost
# quadratically many renders.
MAX_GRANULARITY = 32
SPECULATE = 8            # candidates of one round of a case ddmin rendered together
ONESTEP_BATCH = 8        # one-step candidates (minimal.py) rendered together, smallest first
STRING_KEEP = 1          # a string is shortened no further than this many characters (then tried empty)
PROBE_TEMPLATE = "chatgold probe"   # the "does the engine read the template at all" probe (template_ignored)

Pair = tuple  # (reference Outcome, engine Outcome)
Steps = Generator[list, list, object]


class BudgetSpent(Exception):
    """The reduction used its render budget; what it has is the answer."""


@dataclass
class Found:
    """A reduction's result: the smallest pair found and its rendered outcomes."""

    request: RenderRequest
    reference: Outcome
    engine: Outcome
    symptom: Symptom
    renders: int
    complete: bool           # False when the budget ran out before the passes settled
    phases: dict = field(default_factory=dict)
    ignores_template: bool = False  # the engine renders this case the same with a plain-text template, or keys
    #                                  templates by their exact text (it evaluates none of either)
    owner: tuple = ()        # the data triggers that own the difference (causes.own_differences)
    recognised: bool = False  # the engine keys this template by its exact text: the text picks what it renders

    @property
    def template(self) -> str:
        return self.request.template

    @property
    def recognised_as(self) -> str:
        """The recognised template's identity (cluster.text_identity), or "": an engine that picks a format of
        its own by the template's exact text renders one format for each text it knows, a cause each."""
        return cluster.text_identity(self.request.template) if self.recognised else ""


@dataclass
class NotReproduced:
    reason: str
    renders: int


def keyed_by_text(pair: Pair, variant_pairs: list, target: Symptom) -> bool:
    """Whether the engine keys the template by its exact text, from the pairs of a template and of each of its
    neutral variants (template.neutral_variants: the same template in other bytes): for every variant the
    reference answers alike while the engine's answer changes and loses the `target` difference. A reference
    that prints a variant differently says nothing: not keyed."""
    ref, eng = pair
    for variant_ref, variant_eng in variant_pairs:
        if _answer(ref) != _answer(variant_ref) or _answer(eng) == _answer(variant_eng):
            return False
        symptom = compare(variant_ref, variant_eng)
        if symptom is not None and symptom.keeps(target):
            return False
    return bool(variant_pairs)


def _answer(outcome: Outcome) -> tuple:
    """An outcome as equality of answers sees it."""
    return outcome.kind, getattr(outcome, "text", None), getattr(outcome, "message", None)


def conversation_dict(conversation: Conversation) -> dict:
    return {"messages": conversation.messages, "tools": conversation.tools, "documents": conversation.documents,
            "add_generation_prompt": conversation.add_generation_prompt,
            "continue_final_message": conversation.continue_final_message, "kwargs": dict(conversation.kwargs),
            "now": conversation.now}


def _conversation(data: dict) -> Conversation:
    return Conversation(messages=data["messages"], tools=data["tools"], documents=data["documents"],
                        add_generation_prompt=data["add_generation_prompt"],
                        continue_final_message=data["continue_final_message"], kwargs=data["kwargs"],
                        now=data["now"])


def _canonical(data) -> str:
    # Key order is kept: it is part of the input (`tojson`, `items()` and the like print keys in order).
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class Reduction:
    """Reduce `request` while the engine keeps differing from the reference as `target` says."""

    def __init__(self, request: RenderRequest, target: Symptom, hints: Sequence[str] = (),
                 budget: int = DEFAULT_BUDGET, reduce_template: bool = True):
        self.original = request
        self.target = target
        self.hints = list(hints)
        self.budget = budget
        self.reduce_template = reduce_template
        self.renders = 0
        self.phase = "confirm"
        self.phase_renders: dict = {}   # pass -> renders it spent (benchmarks report where time goes)
        self.memo: dict = {}
        self.best: Optional[tuple] = None   # (request, pair, symptom)
        self.ignores_template = False
        self.recognised = False
        self.complete = True
        # Whether candidates must parse before they are rendered: not when the original does not parse
        # (the reference's compile error is then the difference being reduced).
        self.check_parse = tpl.parses(request.template)

    # -- rendering -------------------------------------------------------------------------------------
    def _request(self, source: str, conversation: dict) -> RenderRequest:
        return RenderRequest(source, _conversation(conversation), self.original.bos_token, self.original.eos_token,
                             self.original.template_id, self.original.case_id)

    def _key(self, request: RenderRequest) -> tuple:
        return (request.template, _canonical(conversation_dict(request.conversation)))

    def render(self, requests: list) -> Steps:
        """Pairs for these requests: from the memo, or one yield for those not rendered yet."""
        missing, seen = [], set()
        for request in requests:
            key = self._key(request)
            if key not in self.memo and key not in seen:
                seen.add(key)
                missing.append(request)
        if missing:
            if self.renders + len(missing) > self.budget:
                raise BudgetSpent()
            self.renders += len(missing)
            self.phase_renders[self.phase] = self.phase_renders.get(self.phase, 0) + len(missing)
            pairs = yield missing
            for request, pair in zip(missing, pairs):
                self.memo[self._key(request)] = pair
        return [self.memo[self._key(r)] for r in requests]

    def test(self, source: str, conversation: dict, remember: bool = True, parse: bool = False) -> Steps:
        """Whether this candidate still differs as the target does (and remember it as the best if so).
        `parse`: check first that the candidate parses (a template rewritten inside its tags may not; one with
        whole nodes of a balanced tree removed always does, and parsing costs as much as a render)."""
        if parse and self.check_parse and not tpl.parses(source):
            return False
        if self.best is not None and minimal.unbinds(self.best[0].template, source, conversation):
            return False   # a name the template bound, now undefined: another difference than the target's
        request = self._request(source, conversation)
        if not source and self.original.template:
            pair, stand_in = yield from self.render([request, self._request(tpl.NEUTRAL_PREFIX, conversation)])
            if minimal.empty_means_none(pair, stand_in):
                return False
        else:
            (pair,) = yield from self.render([request])
        symptom = compare(*pair)
        if symptom is None:
            return False
        if not symptom.keeps(self.target):
            own = self._own(request, pair)
            if own is None or not minimal.keeps(symptom, self.target, self.best[1], None, own=own):
                return False
            if remember:
                self.target = symptom   # the reference's side changed with the template: follow it
        elif remember and symptom.status != self.target.status:
            self.target = symptom   # the reference's own refusal left out (Symptom.keeps): the engine's alone now
        if remember:
            self.best = (request, pair, symptom)
        return True

    def _own(self, request: RenderRequest, pair: Pair) -> Optional[Pair]:
        """The candidate's pair when the engine ignores the template and the candidate changed only the
        template (its data is the best pair's): minimal.keeps then holds the engine's side to the best's."""
        if not self.ignores_template or self.best is None:
            return None
        if _canonical(conversation_dict(request.conversation)) != \
                _canonical(conversation_dict(self.best[0].conversation)):
            return None
        return pair

    def template_ignored(self, source: str, conversation: dict) -> Steps:
        """Whether the engine gives the same outcome for this case with a template of plain text while the
        reference does not: an engine that renders its own format whatever the template says. Its template is
        still reduced, to the smallest on which the reference differs from the engine's own output (every
        smaller template changes only the reference's side: minimal.keeps follows it). Plain text, not an empty
        template: llama.cpp (and others) put a built-in format in place of an empty one, which is the engine's
        own output for a template that *is* that format."""
        full, probe = yield from self.render([self._request(source, conversation),
                                              self._request(PROBE_TEMPLATE, conversation)])
        same = lambda a, b: _answer(a) == _answer(b)
        # The engine's side must be its own output (bytes or a refusal): printing nothing says only that the
        # template printed nothing here.
        own_output = full[1].kind == "raised" or (full[1].kind == "rendered" and full[1].text != "")
        return same(full[1], probe[1]) and not same(full[0], probe[0]) and own_output

    def template_sensitive(self, source: str, conversation: dict) -> Steps:
        """Whether the engine renders an equivalent template (the same template in other bytes) the same way.
        An engine that recognises templates by their exact text (a record keyed by hash) never will: reducing
        the template then only costs renders. The variants (template.neutral_variants) render the same under
        every whitespace mode; should the reference print one differently all the same, the probe says nothing
        and the template is reduced."""
        pair, *variant_pairs = yield from self.render(
            [self._request(t, conversation) for t in [source] + tpl.neutral_variants(source)])
        return not keyed_by_text(pair, variant_pairs, self.target)

    # -- the whole reduction ---------------------------------------------------------------------------
    def run(self) -> Steps:
        conversation = conversation_dict(self.original.conversation)
        source = self.original.template
        if not (yield from self.test(source, conversation)):
            pair = self.memo.get(self._key(self._request(source, conversation)))
            got = compare(*pair) if pair else None
            what = (f"the engine now gives {got.status}" if got is not None else
                    "one side did not answer (" + "; ".join(f"{o.kind}: {getattr(o, 'message', '')[:200]}"
                                                             for o in pair if o.kind not in ("rendered", "raised"))
                    + ")")
            return NotReproduced(f"rendered again, the cell does not differ as it did: {what}", self.renders)
        tree = tpl.build_tree(source)
        try:
            self.phase = "case"
            conversation = yield from self.reduce_case(tpl.source_of(tree), conversation)
            settled = False
            if self.reduce_template:
                self.phase = "probe"
                self.ignores_template = yield from self.template_ignored(tpl.source_of(tree), conversation)
                # An engine that ignores the template is still shown the smallest template on which the
                # reference differs from it (minimal.keeps: its own output held, the reference's followed).
                self.reduce_template = yield from self.template_sensitive(tpl.source_of(tree), conversation)
                self.recognised = not self.reduce_template
                # An engine that keys templates by their exact text evaluates none of it: the template's
                # constructs are no part of its difference, which is keyed as an ignored template's is.
                self.ignores_template = self.ignores_template or not self.reduce_template
            if self.reduce_template:
                self.phase = "hint"
                tree, settled = yield from self.apply_hints(tree, conversation)
            if settled:
                # The transplanted hint is, text for text, another reduction's final template: 1-minimal for
                # that difference there, not always for this one (a macro that carried a value there may carry
                # nothing here), so the template passes still run on it, cheaply on a small template.
                self.phase = "case"
                conversation = yield from self.reduce_case(tpl.source_of(tree), conversation)
            for _ in range(MAX_ROUNDS):
                before = _canonical(conversation)
                if self.reduce_template:
                    for name in ("coverage", "relevance", "hdd", "blocks", "inline", "expressions", "texts"):
                        self.phase = name
                        if name == "blocks":
                            pruned = tpl.source_of(tree)
                        tree = yield from getattr(self, name)(tree, conversation)
                    tree = tpl.build_tree(tpl.source_of(tree))  # rebuilt: unwrapped blocks nest anew
                    if tpl.source_of(tree) != pruned:
                        # what the later passes changed may let more nodes go
                        self.phase = "hdd"
                        tree = yield from self.hdd(tree, conversation)
                self.phase = "case"
                conversation = yield from self.reduce_case(tpl.source_of(tree), conversation)
                # Another round of template passes only when the case shrank (every candidate of a round
                # costs a template compile, or a llama-server start).
                if _canonical(conversation) == before:
                    break
            # Last, until no single registered step keeps the difference: the reproducer is 1-minimal.
            self.phase = "onestep"
            yield from self.onestep()
        except BudgetSpent:
            self.complete = False
        return self.found(self.ignores_template)

    def found(self, ignores_template: bool) -> Found:
        """The best pair so far as the reduction's result."""
        request, pair, symptom = self.best
        return Found(request, pair[0], pair[1], symptom, self.renders, self.complete, dict(self.phase_renders),
                     ignores_template, recognised=self.recognised)

    def run_unreduced(self, reason: str) -> Steps:
        """No reduction (the group is past the per-template limit), only what one probe can tell: if the engine
        renders this very cell the same with a plain-text template while the reference does not, the cell is
        explained by that, with itself as the reproducer. Otherwise it stays unexplained for `reason`."""
        conversation = conversation_dict(self.original.conversation)
        source = self.original.template
        if not (yield from self.test(source, conversation)):
            return NotReproduced(reason, self.renders)
        self.phase = "probe"
        if not (yield from self.template_ignored(source, conversation)):
            return NotReproduced(reason, self.renders)
        request, pair, symptom = self.best
        return Found(request, pair[0], pair[1], symptom, self.renders, True, dict(self.phase_renders), True)

    def onestep(self) -> Steps:
        """Apply the registered single steps (minimal.SHRINKS) to the best pair until none keeps the
        difference: step by step, each step's candidates smallest first; after a step is accepted, its
        candidates are listed anew and tried from where the accepted one stood (those before it were just
        seen to fail). The last sweep tries every candidate of every step and accepts none: 1-minimal."""
        changed = True
        while changed:
            changed = False
            for name in minimal.steps(self.reduce_template):
                start = 0
                while True:
                    request = self.best[0]
                    listed = minimal.candidates(request.template, conversation_dict(request.conversation),
                                                template=self.reduce_template, parse=self.check_parse, only=name)
                    at = yield from self._first_keeping(listed, start)
                    if at is None:
                        break
                    changed, start = True, at

    def _first_keeping(self, listed: list, start: int) -> Steps:
        """The index of the first candidate from `start` on that keeps the difference (made the best), or None.
        A candidate that renamed a literal keeps it renamed (minimal.keeps); the target follows the rename."""
        for offset in range(start, len(listed), ONESTEP_BATCH):
            chunk = listed[offset:offset + ONESTEP_BATCH]
            requests = [self._request(source, conv) for _, _, source, conv, _ in chunk]
            pairs = yield from self.render(requests)
            for index, (candidate, pair) in enumerate(zip(requests, pairs)):
                symptom = compare(*pair)
                rename = chunk[index][4]
                own = self._own(candidate, pair)
                if minimal.keeps(symptom, self.target, self.best[1], rename, own=own):
                    if (rename is not None or own is not None) and symptom.status == Status.DIVERGED:
                        self.target = replace(self.target, edits=symptom.edits, first=symptom.first)
                    elif symptom.status != self.target.status:
                        self.target = symptom   # as in test(): the engine's refusal alone now
                    self.best = (candidate, pair, symptom)
                    return offset + index
        return None

    # -- generic ddmin ---------------------------------------------------------------------------------
    def prefetch(self, candidates: list) -> Steps:
        """Render these (source, conversation) candidates in one batch, for tests that follow: candidates of
        one template cost little more together than one (the template compiles, or its server starts, once)."""
        requests = [self._request(source, conv) for source, conv in candidates]
        requests = [r for r in requests if self._key(r) not in self.memo]
        if requests and self.renders + len(requests) <= self.budget:
            yield from self.render(requests)

    def ddmin(self, items: list, build: Callable[[list], tuple], speculate: bool = False) -> Steps:
        """A 1-minimal subset of `items` for which the candidate build(subset) -> (source, conversation) still
        differs as the target does (build(items) is assumed to). `speculate`: render each round's candidates
        in one batch (for candidates that share a template)."""
        def test(subset):
            return self.test(*build(subset))

        if not items:
            return items
        if speculate:
            yield from self.prefetch([build([])] + [build(items[:len(items) // 2]), build(items[len(items) // 2:])])
        if (yield from test([])):
            return []
        n = 2
        while len(items) >= 2:
            size = len(items)
            chunks = [items[i * size // n:(i + 1) * size // n] for i in range(n)]
            chunks = [c for c in chunks if c]
            rests = [[x for i, c in enumerate(chunks) if i != index for x in c] for index in range(len(chunks))]
            if speculate:
                yield from self.prefetch([build(c) for c in chunks + rests if len(c) < size][:SPECULATE])
            for chunk in chunks:
                if len(chunk) < size and (yield from test(chunk)):
                    items, n = chunk, 2
                    break
            else:
                for rest in rests:
                    if len(rest) < size and (yield from test(rest)):
                        items, n = rest, max(n - 1, 2)
                        break
                else:
                    if n >= size or n >= MAX_GRANULARITY:
                        break
                    n = min(size, 2 * n)
        return items

    # -- case ------------------------------------------------------------------------------------------
    def reduce_case(self, source: str, conversation: dict) -> Steps:
        conv = dict(conversation)

        def with_(**fields):
            return (source, {**conv, **fields})

        messages = conv["messages"]
        if isinstance(messages, list) and messages:
            kept = yield from self.ddmin(list(range(len(messages))),
                                         lambda idx: with_(messages=[messages[i] for i in idx]), speculate=True)
            conv["messages"] = [messages[i] for i in kept]
        for name in ("tools", "documents"):
            value = conv[name]
            if value is None:
                continue
            if (yield from self.test(*with_(**{name: None}))):
                conv[name] = None
                continue
            if isinstance(value, list) and value:
                kept = yield from self.ddmin(list(range(len(value))),
                                             lambda idx, name=name, value=value: with_(**{name: [value[i] for i in idx]}),
                                             speculate=True)
                conv[name] = [value[i] for i in kept]
        for flag in ("add_generation_prompt", "continue_final_message"):
            if conv[flag] and (yield from self.test(*with_(**{flag: False}))):
                conv[flag] = False
        if conv["kwargs"]:
            kwargs = conv["kwargs"]
            kept = yield from self.ddmin(sorted(kwargs), lambda keys: with_(kwargs={k: kwargs[k] for k in keys}),
                                         speculate=True)
            conv["kwargs"] = {k: kwargs[k] for k in kept}
        # inside values: keys and list items dropped, strings cut
        for index in range(len(conv["messages"])):
            def one(value, index=index):
                current = conv["messages"]
                return with_(messages=current[:index] + [value] + current[index + 1:])
            reduced = yield from self.reduce_value(conv["messages"][index], one, protect=("role",))
            conv["messages"] = conv["messages"][:index] + [reduced] + conv["messages"][index + 1:]
        for name in ("tools", "documents", "kwargs"):
            if conv[name]:
                conv[name] = yield from self.reduce_value(conv[name], lambda value, name=name: with_(**{name: value}))
        return conv

    def reduce_value(self, value, wrap: Callable, protect: tuple = (), depth: int = 0) -> Steps:
        """A smaller JSON value whose candidate wrap(value) -> (source, conversation) still differs as the target
        does: keys dropped, list items dropped, strings cut."""
        if depth > 8:
            return value
        if isinstance(value, dict):
            keys = [k for k in value if k not in protect]

            def keep_keys(chosen, value=value):
                return wrap({k: v for k, v in value.items() if k in protect or k in chosen})
            kept = yield from self.ddmin(keys, keep_keys, speculate=True)
            current = {k: v for k, v in value.items() if k in protect or k in kept}
            for key in list(current):
                current[key] = yield from self.reduce_value(current[key], lambda v, key=key: wrap({**current, key: v}),
                                                            depth=depth + 1)
            return current
        if isinstance(value, list):
            current = list(value)
            if current:
                kept = yield from self.ddmin(list(range(len(current))),
                                             lambda idx: wrap([current[i] for i in idx]), speculate=True)
                current = [current[i] for i in kept]
            for index in range(len(current)):
                current[index] = yield from self.reduce_value(
                    current[index], lambda v, index=index: wrap(current[:index] + [v] + current[index + 1:]),
                    depth=depth + 1)
            return current
        if isinstance(value, str) and len(value) > STRING_KEEP:
            current = value
            candidates = ["", current[:STRING_KEEP], current[:len(current) // 2]]
            yield from self.prefetch([wrap(c) for c in candidates])
            for candidate in candidates[:2]:
                if (yield from self.test(*wrap(candidate))):
                    return candidate
            while len(current) > 2 * STRING_KEEP:
                half = current[:len(current) // 2]
                if not (yield from self.test(*wrap(half))):
                    break
                current = half
            return current
        return value

    # -- template --------------------------------------------------------------------------------------
    def try_tree(self, tree: tuple, conversation: dict, parse: bool = False) -> Steps:
        ok = yield from self.test(tpl.source_of(tree), conversation, parse=parse)
        return ok

    def apply_hints(self, tree: tuple, conversation: dict) -> Steps:
        """Reproducers of similar templates, transplanted: keep this tree's segments that appear in one.
        Returns (tree, whether the tree kept is exactly that reproducer's template)."""
        for hint in self.hints:
            wanted = {tpl.match_key(leaf) for leaf in tpl.segments(hint)}
            candidate = _keep_matching(tree, wanted)
            if candidate != tree and (yield from self.try_tree(candidate, conversation)):
                return candidate, tpl.source_of(candidate) == hint
        return tree, False

    def coverage(self, tree: tuple, conversation: dict) -> Steps:
        if not any(isinstance(n, tpl.Block) for n in tree):
            return tree
        source, arms = tpl.instrumented(tree)
        if self.check_parse and not tpl.parses(source):
            return tree
        (pair,) = yield from self.render([self._request(source, conversation)])
        ran = set()
        for outcome in pair:
            if outcome.kind == "rendered":
                ran |= tpl.executed_arms(outcome.text, arms)
        if not any(o.kind == "rendered" for o in pair):
            return tree
        candidate = tpl.prune_unexecuted(tree, ran)
        if candidate != tree and (yield from self.try_tree(candidate, conversation)):
            return candidate
        return tree

    def relevance(self, tree: tuple, conversation: dict) -> Steps:
        """For different bytes: render once with every output tag wrapped in markers, then drop the outputs
        that printed the same on both sides (with the text between tags, then without touching it)."""
        if self.target.status != Status.DIVERGED:
            return tree
        source, leaves = tpl.instrumented_outputs(tree)
        if not leaves or (self.check_parse and not tpl.parses(source)):
            return tree
        (pair,) = yield from self.render([self._request(source, conversation)])
        if not all(o.kind == "rendered" for o in pair):
            return tree
        ref, eng = (tpl.printed_by_outputs(o.text) for o in pair)
        if not ref and not eng:
            return tree
        agreeing = [path for number, path in leaves.items() if ref.get(number, []) == eng.get(number, [])]
        if not agreeing:
            return tree
        without = tpl.remove_paths(tree, agreeing)
        wordy = [path for path in tpl.all_paths(without)
                 if isinstance(tpl.node_at(without, path), tpl.Leaf)
                 and tpl.node_at(without, path).kind in ("text", "comment")
                 and tpl.node_at(without, path).text.strip()]
        for candidate in (tpl.remove_paths(without, wordy), without):
            if candidate != tree and (yield from self.try_tree(candidate, conversation)):
                return candidate
        return tree

    def hdd(self, tree: tuple, conversation: dict) -> Steps:
        depth = 0
        while True:
            paths = tpl.paths_at_depth(tree, depth)
            if not paths:
                return tree
            base = tree

            def build(chosen, base=base, paths=paths):
                return tpl.source_of(tpl.remove_paths(base, set(paths) - set(chosen))), conversation
            kept = yield from self.ddmin(paths, build)
            tree = tpl.remove_paths(base, set(paths) - set(kept))
            depth += 1

    def blocks(self, tree: tuple, conversation: dict) -> Steps:
        # Last node first: a change rewrites only that node's subtree and shifts later siblings, which are
        # done, so the paths still to visit stay valid.
        for path in reversed(list(tpl.all_paths(tree))):
            node = tpl.node_at(tree, path)
            if not isinstance(node, tpl.Block):
                continue
            changed = yield from self.first_kept(tree, path, tpl.block_variants(node), conversation, parse=True)
            tree = changed if changed is not None else tree
        return tree

    def inline(self, tree: tuple, conversation: dict) -> Steps:
        """Macro calls replaced by the macro's body, one call at a time, while that still reproduces."""
        changed, inlined = True, False
        while changed:
            changed = False
            for candidate in tpl.inline_variants(tree):
                if (yield from self.try_tree(candidate, conversation, parse=True)):
                    tree, changed, inlined = tpl.build_tree(tpl.source_of(candidate)), True, True
                    break
        if inlined:
            tree = yield from self.hdd(tree, conversation)  # the macro, no longer called, can go
        return tree

    def expressions(self, tree: tuple, conversation: dict) -> Steps:
        for path in list(tpl.all_paths(tree)):
            while True:
                node = tpl.node_at(tree, path)
                leaf = node.arms[0].tag if isinstance(node, tpl.Block) else node
                if leaf.kind not in ("output", "stmt"):
                    break
                if isinstance(node, tpl.Block):
                    replacements = [(replace(node, arms=(replace(node.arms[0], tag=v),) + node.arms[1:]),)
                                    for v in tpl.expression_variants(leaf)]
                else:
                    replacements = [(v,) for v in tpl.expression_variants(leaf)]
                changed = yield from self.first_kept(tree, path, replacements, conversation, parse=True)
                if changed is None:
                    break
                tree = changed
        return tree

    def first_kept(self, tree: tuple, path: tuple, replacements, conversation: dict, parse: bool = False) -> Steps:
        """The tree with the node at `path` replaced by the first replacement that still reproduces, or None."""
        for new in replacements:
            candidate = tpl.replace_at(tree, path, new)
            if (yield from self.try_tree(candidate, conversation, parse=parse)):
                return candidate
        return None

    def texts(self, tree: tuple, conversation: dict) -> Steps:
        for path in reversed(list(tpl.all_paths(tree))):
            while True:
                node = tpl.node_at(tree, path)
                if not (isinstance(node, tpl.Leaf) and node.kind in ("text", "comment")):
                    break
                replacements = [()] if node.kind == "comment" else [(v,) for v in tpl.text_variants(node)]
                changed = yield from self.first_kept(tree, path, replacements, conversation)
                if changed is None or node.kind == "comment":
                    tree = changed if changed is not None else tree
                    break
                tree = changed
        return tree


def _keep_matching(tree: tuple, wanted: set) -> tuple:
    """The tree keeping only leaves whose text is in `wanted`, and blocks (with their tags) around them."""

    def walk(nodes_: tuple) -> tuple:
        out = []
        for node in nodes_:
            if isinstance(node, tpl.Leaf):
                if tpl.match_key(node) in wanted:
                    out.append(node)
                continue
            arms = []
            for arm in node.arms:
                body = walk(arm.body)
                if body or tpl.match_key(arm.tag) in wanted:
                    arms.append(replace(arm, body=body))
            if not arms:
                continue
            if node.keyword in ("if", "for") and arms[0].tag is not node.arms[0].tag:
                arms.insert(0, replace(node.arms[0], body=()))
            out.append(replace(node, arms=tuple(arms)))
        return tuple(out)

    return walk(tree)
