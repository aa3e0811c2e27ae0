"""Which construct of a reproducer is its culprit, when a 1-minimal reproducer keeps several: checked by
rendering the construct alone on the values the reference shows reaching it.

A reducer keeps every construct the difference needs, and a construct that only carries a value to the one
that misbehaves is needed too: `{% set t = m(message.content) %}{{ {'': t}|tojson }}` keeps the macro because
nothing else puts the content in front of `tojson`. Keyed by all its culprits, one bug reached through a macro,
`.get()`, `caller()` or a `{% set %}` block is as many causes as there are routes to it.

For each site of a culprit that takes values (a filter, a test, a method, `loop.*` over what its loop
iterates; `.items()` too, a carrier that reorders), the reference renders the reproducer once more with one
output added just before the site's tag, in its scope, printing what reaches the site as JSON: the value it is
applied to and its arguments that are not literals. Each value seen (at most MAX_VALUES) is then given to the
site alone, `{{ x[0]|f(x[1]) }}`, on both sides (`x` as the request's data, or, for an engine whose request
layer passes no variables of the caller's, set from a literal in the template). The construct is a culprit
when, alone, it shows the reproducer's kind of difference: the same refusal, or different output of the same
difference class (cluster.difference_class); a test or a loop attribute is a culprit when, alone, it answers
differently (what its answer makes the template print is the template's). The values go in one list (kwargs
`x`), so an engine that drops null keys cannot change them, and a control render checks the engine binds that
list as the reference does.

When some site shows it, the reproducer is keyed and titled by those constructs only (narrowed); the others
carried the value. When none does, every culprit stays: isolation never merges what rendering did not show.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Iterable, Optional

from jinja2 import nodes

from conformance.explain import cluster
from conformance.explain.driver import render_pairs
from conformance.explain.signature import compare
from conformance.explain.template import (
    PRINTER,
    Block,
    _env,
    _parse_expr,
    _split_for_condition,
    _tag_expression,
    build_tree,
)
from conformance.judge.status import Status
from runners.base import Conversation, RenderRequest

OPEN, SEP, CLOSE = "\ue004", "\ue005", "\ue006"
# A captured value that is undefined (a name the template never bound) prints as this; the site alone then reads
# an unbound name in its place (UNBOUND_NAME), which only the literal route can write.
UNDEFINED = "\ue007"
UNBOUND_NAME = "_chatgold_undefined"
_CAPTURED = re.compile(OPEN + r"(\d+)" + SEP + "(.*?)" + CLOSE, re.S)
MAX_SITES = 8     # sites captured per reproducer (one reference render each)
MAX_VALUES = 3    # distinct values tried per site (two renders per side each: the site alone, the control;
                  # two more where `x` is then written as a literal)
# Prints a dot per item of `x`: an engine that does not bind kwargs as the reference does fails it, and its
# site alone is then no evidence (a test on an unbound `x` answers otherwise for that reason alone).
CONTROL = "{% for i in x %}.{% endfor %}"
# Carriers that compute a value of their own (an order): isolated like a culprit, keyed like the carrier.
VALUE_CARRIERS = frozenset({"method:items", "filter:items"})


@dataclass(frozen=True)
class Site:
    """One filter, test or method call of a tag's expression: its inventory name, the expression capturing what
    reaches it (a JSON list: the value, then each argument that is not a literal), and the site alone with those
    read from `x`."""

    name: str
    capture: str      # a jinja2 expression
    alone: str        # a template reading x[0], x[1], ...
    test: bool


def _name(node) -> Optional[str]:
    if isinstance(node, nodes.Filter):
        return f"filter:{node.name}"
    if isinstance(node, nodes.Test):
        return f"test:{node.name}"
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
        return f"method:{node.node.attr}"
    return None


def _site(node, name: str) -> Optional[Site]:
    """The capture and the alone template of one node; None when it cannot be isolated (`*args`, a filter
    block, a value that is a literal: then it carries nothing from elsewhere)."""
    if node.dyn_args is not None or node.dyn_kwargs is not None:
        return None
    subject = node.node.node if isinstance(node, nodes.Call) else node.node
    if subject is None:
        return None
    captured = [subject]
    counter = [1]

    def slot(value):
        if isinstance(value, nodes.Const):
            return value
        captured.append(value)
        counter[0] += 1
        return nodes.Getitem(nodes.Name("x", "load"), nodes.Const(counter[0] - 1), "load")

    x0 = nodes.Getitem(nodes.Name("x", "load"), nodes.Const(0), "load")
    args = [slot(a) for a in node.args]
    kwargs = [nodes.Keyword(k.key, slot(k.value)) for k in node.kwargs]
    if isinstance(node, nodes.Call):
        alone = nodes.Call(nodes.Getattr(x0, node.node.attr, "load"), args, kwargs, None, None)
    else:
        alone = type(node)(x0, node.name, args, kwargs, None, None)
    # each value as itself, or the mark when it is undefined (tojson refuses an undefined value)
    marked = [nodes.CondExpr(nodes.Test(value, "defined", [], [], None, None), value, nodes.Const(UNDEFINED))
              for value in captured]
    try:
        capture = PRINTER.expr(nodes.List(marked))
        text = PRINTER.expr(alone)
    except Exception:  # a node the printer does not take: not isolated
        return None
    if isinstance(node, nodes.Test):
        return Site(name, capture, "{% if " + text + " %}1{% else %}0{% endif %}", True)
    if name in VALUE_CARRIERS:
        # an order: the keys as they come (how a pair prints is not what `.items()` computes)
        return Site(name, capture, "{% for k, v in " + text + " %}{{ k }},{% endfor %}", False)
    return Site(name, capture, "{{ " + text + " }}", False)


# Loop attributes isolated: the booleans through `if` (how an engine prints a boolean is not the attribute),
# the numbers printed.
LOOP_BOOLEANS = frozenset({"first", "last"})
LOOP_NUMBERS = frozenset({"index", "index0", "revindex", "revindex0", "length"})


def _loop_attribute(node) -> Optional[str]:
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop" and \
            node.attr in LOOP_BOOLEANS | LOOP_NUMBERS:
        return node.attr
    return None


def _loop_of(block: Block):
    """(the `for` block, its iterable's node), or None for a loop whose `loop.*` the iterable alone does not
    give (a filter condition, `recursive`)."""
    parts = _tag_expression(block.arms[0].tag)
    if parts is None or parts[3].strip() or _split_for_condition(parts[2]) is not None:
        return None
    expr = _parse_expr(parts[2])
    return None if expr is None else (block, expr)


def _loop_site(attribute: str, iterable) -> Optional[Site]:
    """`loop.<attribute>` alone over what the loop iterates: a flip (any other answer) is the attribute's."""
    try:
        capture = PRINTER.expr(nodes.List([iterable]))
    except Exception:
        return None
    body = ("{% if loop." + attribute + " %}1{% else %}0{% endif %}" if attribute in LOOP_BOOLEANS
            else "{{ loop." + attribute + " }},")
    return Site(f"loop:{attribute}", capture, "{% for i in x[0] %}" + body + "{% endfor %}", True)


def sites(template: str, names: Iterable[str]) -> list:
    """[(Site, template with its capture)]: every site of `names` in a tag with one expression (an output, `set`,
    `if`, `for`), the capture printed just before the tag (before the block of an `if` or a `for`), at most
    MAX_SITES."""
    wanted = set(names)
    try:
        tree = build_tree(template)
    except Exception:
        return []
    found: list = []

    def walk(items: tuple, loop) -> None:
        """`loop`: (the innermost `for` block, its iterable's node) whose `loop.*` the body reads, or None."""
        for node in items:
            if len(found) >= MAX_SITES:
                return
            if isinstance(node, Block):
                tag = node.arms[0].tag
                leaves = [(tag, node)]
                inner = loop
                if node.keyword == "for":
                    inner = _loop_of(node)
                elif node.keyword in ("macro", "call"):
                    inner = None   # a macro's body runs in the loop of its call, not of its definition
                for number, arm in enumerate(node.arms):
                    walk(arm.body, inner if number == 0 else loop)
            else:
                leaves = [(node, node)]
            for leaf, anchor in leaves:
                parts = _tag_expression(leaf)
                if parts is None or leaf.keyword == "elif":
                    continue
                text = parts[2]
                if leaf.keyword == "for":   # `for x in xs if c`: the iterable only (c reads the loop's names)
                    text = (_split_for_condition(text) or (text,))[0]
                expr = _parse_expr(text)
                if expr is None:
                    continue
                for sub in [expr] + list(expr.find_all(nodes.Expr)):
                    name = _name(sub)
                    if name in wanted and len(found) < MAX_SITES:
                        site = _site(sub, name)
                        if site is not None:
                            found.append((site, anchor))
                    attribute = _loop_attribute(sub)
                    if loop is not None and attribute and f"loop:{attribute}" in wanted and \
                            len(found) < MAX_SITES:
                        site = _loop_site(attribute, loop[1])
                        if site is not None and (site, loop[0]) not in found:
                            found.append((site, loop[0]))

    walk(tree, None)
    out = []
    for number, (site, anchor) in enumerate(found):
        probe = "{{ '" + OPEN + str(number) + SEP + "' ~ (" + site.capture + "|tojson) ~ '" + CLOSE + "' }}"
        source = _with_before(tree, anchor, probe)
        if source is not None:
            out.append((number, site, source))
    return out


def _with_before(tree: tuple, anchor, text: str) -> Optional[str]:
    """The tree's source with `text` inserted just before `anchor` (a leaf or a block), in its scope."""
    done = [False]

    def source(items: tuple) -> str:
        out = []
        for node in items:
            if node is anchor and not done[0]:
                done[0] = True
                out.append(text)
            if isinstance(node, Block):
                out.append("".join(arm.tag.text + source(arm.body) for arm in node.arms) + node.end.text)
            else:
                out.append(node.text)
        return "".join(out)

    result = source(tree)
    if not done[0]:
        return None
    try:
        _env().parse(result)
    except Exception:
        return None
    return result


def _same_kind(found_symptom, found_reference, found_engine, pair, test: bool) -> bool:
    """Whether the site alone (`pair`) shows the reproducer's kind of difference (see the module docstring)."""
    reference, engine = pair
    symptom = compare(reference, engine)
    if symptom is None or not symptom.differs:
        return False
    if test:
        return reference.kind == engine.kind == "rendered"
    if symptom.status != found_symptom.status:
        return False
    if symptom.status == Status.DIVERGED:
        return cluster.difference_class(reference.text, engine.text) == \
            cluster.difference_class(found_reference.text, found_engine.text)
    return cluster._QUOTED.sub("'…'", symptom.refusal) == cluster._QUOTED.sub("'…'", found_symptom.refusal)


@dataclass
class Job:
    """One reproducer to isolate: its request and outcomes, the candidate constructs, and what was found."""

    request: RenderRequest
    symptom: object
    reference: object
    engine: object
    names: list
    shown: Optional[set] = None     # the constructs shown alone (None: isolation did not apply)


def candidates(constructs: list, ignores_template: bool = False) -> list:
    """The constructs worth isolating: the culprits that take values, and the carriers that compute one, when
    the reproducer has a culprit that may only carry a value to another construct (a reproducer with one
    culprit and nothing else that computes a value is already keyed by what misbehaves), or a test (keyed by
    what it tests unless the test alone is shown to answer differently)."""
    culprits = cluster.culprits(constructs)
    names = sorted(n for n in set(constructs) if n in VALUE_CARRIERS or
                   (n in culprits and n.split(":", 1)[0] in ("filter", "test", "method", "loop")))
    if ignores_template or not culprits:
        return []
    if len(set(culprits) | set(names)) < 2 and not any(n.startswith("test:") for n in names):
        return []
    return names


def isolate(jobs: list, reference, engine, stats=None) -> None:
    """Fill each job's `shown`: the constructs that alone show its kind of difference (see the module
    docstring). Batches: the captures on the reference, then every site alone on both sides (with `x` as data),
    then, where the engine did not take the data, with `x` written as a literal."""
    probes, owners = [], []
    for index, job in enumerate(jobs):
        for number, site, source in sites(job.request.template, job.names):
            probes.append(replace(job.request, template=source))
            owners.append((index, number, site))
    if not probes:
        return
    try:
        captured = list(reference.render_many(probes))
    except Exception:  # a runner failure isolates nothing: every culprit stays
        return
    data, literal_route = [], []   # (job index, site, dots, the site alone, its control, conversation)
    for (index, number, site), outcome in zip(owners, captured):
        if outcome.kind != "rendered":
            continue
        values, seen = [], set()
        for match in _CAPTURED.finditer(outcome.text):
            if int(match.group(1)) != number or match.group(2) in seen:
                continue
            seen.add(match.group(2))
            try:
                values.append(json.loads(match.group(2)))
            except ValueError:
                continue
            if len(values) >= MAX_VALUES:
                break
        conversation = jobs[index].request.conversation
        for value in values:
            plain = Conversation(messages=[{"role": "user", "content": "H"}],
                                 add_generation_prompt=conversation.add_generation_prompt,
                                 continue_final_message=conversation.continue_final_message, now=conversation.now)
            # `x` as the request's data; else written into the template as a literal: an engine whose request
            # layer passes no variables of the caller's (TGI, mistral.rs) still evaluates a literal, and an
            # undefined value has no data form
            written = "{% set x = [" + ", ".join(UNBOUND_NAME if item == UNDEFINED else literal(item)
                                                   for item in value) + "] %}"
            fallback = (index, site, "." * len(value), written + site.alone, written + CONTROL, plain)
            if UNDEFINED in value:
                literal_route.append(fallback)
            else:
                data.append(((index, site, "." * len(value), site.alone, CONTROL, replace(plain, kwargs={"x": value})),
                             fallback))
    # the data route first; the literal only where the engine did not take the data
    untaken = _shown_alone(jobs, [route for route, _ in data], reference, engine, stats)
    _shown_alone(jobs, literal_route + [fallback for (route, fallback) in data if id(route) in untaken],
                 reference, engine, stats)


def _shown_alone(jobs: list, routes: list, reference, engine, stats) -> set:
    """Render each route's site alone and its control on both sides; a site whose control shows the engine was
    given `x` as the reference was (every item) and that alone shows the job's kind of difference is shown.
    Returns the ids of the routes whose control failed (the site alone said nothing)."""
    requests = []
    for index, _, _, template, control, conversation in routes:
        requests += [replace(jobs[index].request, template=source, conversation=conversation)
                     for source in (template, control)]
    pairs = render_pairs(reference, engine, requests, stats) if requests else []
    untaken = set()
    for number, route in enumerate(routes):
        index, site, dots = route[:3]
        job = jobs[index]
        if job.shown is None:
            job.shown = set()
        pair, control = pairs[2 * number], pairs[2 * number + 1]
        if not all(outcome.kind == "rendered" and outcome.text == dots for outcome in control):
            untaken.add(id(route))
            continue
        if _same_kind(job.symptom, job.reference, job.engine, pair, site.test):
            job.shown.add(site.name)
    return untaken


def literal(value) -> str:
    """A JSON value (what a capture printed) as a Jinja literal that every engine reads back as that value."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(literal(item) for item in value) + "]"
    return "{" + ", ".join(f"{literal(str(key))}: {literal(item)}" for key, item in value.items()) + "}"


def narrowed(constructs: list, shown: Optional[set]) -> list:
    """The reproducer's constructs as its key and title see them: when some construct alone showed its
    difference, the other culprits are left out (they carried the value), and each shown one is marked
    `shown:NAME` (a test shown alone is keyed without what it tests: cluster.tested_reads); else all of them."""
    if not shown:
        return list(constructs)
    culprits = set(cluster.culprits(constructs))
    return [n for n in constructs if n not in culprits or n in shown] + ["shown:" + n for n in sorted(shown)]


def isolated_constructs(request: RenderRequest, symptom, reference_outcome, engine_outcome, reference, engine,
                        ignores_template: bool = False, stats=None) -> list:
    """One reproducer's constructs, narrowed to its culprit when rendering shows which (isolate)."""
    constructs = cluster.constructs_of(request.template)
    names = candidates(constructs, ignores_template)
    if not names:
        return constructs
    job = Job(request, symptom, reference_outcome, engine_outcome, names)
    isolate([job], reference, engine, stats)
    return narrowed(constructs, job.shown)
