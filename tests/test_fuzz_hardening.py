"""Fuzz the hardening (issues #21 and #32): templates, cases, service request bodies, tokenizer_config shapes
(lint and import), raw request headers and result store states, hypothesis-generated with a fixed seed. Properties: no traceback (an evaluator render ends Rendered, Raised, or Errored at a documented
limit, never "harness failed" or a crashed harness; a case loads or is refused with CaseError), no 5xx from the
service (but the documented 503 busy) and JSON for every error, no unbounded allocation (the renderer's and the
server's peak memory stay under a bound); a tokenizer_config is read or refused with an error naming the file;
headers over the limit get 431; the store never raises on a state it finds, never hangs on one, and never
deletes a file it did not write.

`tox -e py` runs a slice (FUZZ_SLICE inputs per target); `python benchmarks/fuzz_hardening.py` runs the full
10,000 inputs (CHATGOLD_FUZZ_EXAMPLES per target) and records the figures README.md shows.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import start_service, stop_service

from conformance.corpus.cases import CaseError, case_from_data
from runners.base import RenderRequest

FUZZ_SLICE = {"templates": 500, "cases": 500, "bodies": 400, "configs": 300, "headers": 150, "stores": 300}
EXAMPLES = {target: int(os.environ.get("CHATGOLD_FUZZ_EXAMPLES", count)) for target, count in FUZZ_SLICE.items()}
PEAK_MB = 1024          # the evaluator harness's peak RSS over a whole run (its cap: 2 GiB address space)
SERVER_GROWTH_MB = 150  # the server's peak RSS growth over a whole run
FIGURES: dict = {}      # target -> {"inputs", "outcomes", ...}; written to CHATGOLD_FUZZ_REPORT when set

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much, HealthCheck.large_base_example])


def _record(target: str, **figures) -> None:
    FIGURES.setdefault(target, {}).update(figures)
    path = os.environ.get("CHATGOLD_FUZZ_REPORT")
    if path:
        existing = json.loads(open(path).read()) if os.path.exists(path) else {}
        existing.update(FIGURES)
        with open(path, "w") as handle:
            json.dump(existing, handle, indent=1, sort_keys=True)


# -- templates ---------------------------------------------------------------------------------------------

NAMES = ["messages", "messages[0]", "messages[0].content", "messages[-1]['role']", "tools", "bos_token",
         "add_generation_prompt", "undefined_name", "loop", "ns.x", "range(5)", "namespace", "dict"]
SMALL_INTS = st.integers(-3, 12)
BIG_INTS = st.sampled_from([10**6, 10**7, 10**9, 2**31, 10**18, 10**100])
STRINGS = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="'\\\r{}%#"), max_size=8)
FILTERS = ["join", "replace", "indent", "center", "wordwrap", "format", "tojson", "pprint", "batch", "slice",
           "sum", "list", "string", "upper", "trim", "length", "first", "last", "reverse", "sort", "unique",
           "map", "select", "reject", "items", "dictsort", "default", "int", "float", "abs", "round", "escape",
           "safe", "striptags", "title", "truncate", "wordcount", "urlencode", "xmlattr", "groupby", "min", "max",
           "count", "capitalize", "lower", "filesizeformat", "attr", "selectattr", "random"]
METHODS = ["join", "replace", "format", "center", "ljust", "zfill", "expandtabs", "split", "strip", "upper",
           "startswith", "items", "keys", "get", "to_bytes", "translate", "format_map", "count", "index"]
OPERATORS = ["*", "+", "%", "~", "**", "-", "//", "/", "==", "in", "and", "or"]
BOMBS = ["(['x'*10000000]*300)", "('x'*30000000)", "(['x']*5000000)", "[1]|batch(999999999,'x')",
         "messages|tojson(indent=10**9)", "'{:>999999999}'.format(1)", "'%999999999d' % 1", "lipsum(99999999)",
         "(1).to_bytes(10**9,'big')", "range(100000)|list", "7 ** 7 ** 7"]


def _literal():
    return st.one_of(SMALL_INTS.map(str), BIG_INTS.map(str), STRINGS.map(lambda s: repr(s)),
                     st.just("none"), st.just("true"), st.just("[1, 'a', [2]]"), st.just("{'k': 'v'}"))


def _expression(inner):
    args = st.lists(inner, max_size=3).map(", ".join)
    return st.one_of(
        st.tuples(inner, st.sampled_from(FILTERS), args).map(lambda t: f"({t[0]})|{t[1]}({t[2]})"),
        st.tuples(inner, st.sampled_from(METHODS), args).map(lambda t: f"({t[0]}).{t[1]}({t[2]})"),
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, inner).map(lambda t: f"({t[0]})[{t[1]}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
    )


EXPRESSIONS = st.recursive(st.one_of(_literal(), st.sampled_from(NAMES), st.sampled_from(BOMBS)), _expression,
                           max_leaves=6)


def _statement(inner):
    body = st.lists(inner, min_size=1, max_size=3).map("".join)
    return st.one_of(
        st.tuples(EXPRESSIONS, body).map(lambda t: f"{{% for x in {t[0]} %}}{t[1]}{{% endfor %}}"),
        st.tuples(EXPRESSIONS, body, body).map(lambda t: f"{{% if {t[0]} %}}{t[1]}{{% else %}}{t[2]}{{% endif %}}"),
        st.tuples(EXPRESSIONS, body).map(lambda t: f"{{% set ns.x = {t[0]} %}}{t[1]}"),
        body.map(lambda b: f"{{% macro m(a) %}}{b}{{{{ a }}}}{{% endmacro %}}{{{{ m(m(1)) }}}}"),
        body.map(lambda b: f"{{% filter upper %}}{b}{{% endfilter %}}"),
    )


TEMPLATES = st.recursive(
    st.one_of(EXPRESSIONS.map(lambda e: f"{{{{ {e} }}}}"), STRINGS, st.just("{% raise %}"), st.just("{{ }}"),
              st.just("{% for %}"), st.just("{{ raise_exception('no') }}")),
    _statement, max_leaves=8,
).map(lambda body: "{% set ns = namespace(x=0) %}" + body)


@pytest.fixture(scope="module")
def evaluator():
    from runners.evaluator.runner import EvaluatorRunner

    runner = EvaluatorRunner(timeout=1.0)
    yield runner
    runner.close()


def _harness_peak_mb(runner) -> int:
    procs = runner._harness()._all
    peaks = []
    for proc in procs:
        try:
            with open(f"/proc/{proc.proc.pid}/status") as status:
                peaks.append(next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) // 1024)
        except OSError:
            pass
    return max(peaks, default=0)


def _check_outcome(outcome, label) -> str:
    assert outcome.kind in ("rendered", "raised", "errored"), (label, outcome)
    if outcome.kind == "errored":
        assert "limit" in outcome.message and "harness failed" not in outcome.message, (label, outcome)
    return outcome.kind if outcome.kind != "errored" else "errored-at-a-limit"


def test_fuzz_templates(evaluator):
    seen: Counter = Counter()
    started = time.monotonic()

    @settings(max_examples=EXAMPLES["templates"], **SETTINGS)
    @given(source=TEMPLATES)
    def prop(source):
        outcome = evaluator.render(RenderRequest.make(source, [{"role": "user", "content": "hi"}]))
        seen[_check_outcome(outcome, source)] += 1

    prop()
    runner = evaluator._harness()
    peak = _harness_peak_mb(evaluator)
    _record("templates", inputs=sum(seen.values()), outcomes=dict(seen), restarts=runner.restarts,
            harness_peak_mb=peak, seconds=round(time.monotonic() - started, 1))
    assert sum(seen.values()) >= EXAMPLES["templates"] * 0.9
    assert runner.restarts == 0, "a render crashed or hung its harness"
    assert peak < PEAK_MB, peak


# -- cases -------------------------------------------------------------------------------------------------

SURROGATES = st.characters(categories=["Cs"])
ANY_TEXT = st.text(st.one_of(st.characters(codec="utf-8"), SURROGATES), max_size=12)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), ANY_TEXT,
              st.sampled_from(["x" * 1_000_000, "\ud800" * 1000])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)),
    max_leaves=12)


def _deep(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


CONTENT = st.one_of(ANY_TEXT, st.sampled_from(["x" * 1_000_000, "\ud800" * 1000]),
                    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": ANY_TEXT}),
                             max_size=3),
                    st.integers(0, 3000).map(_deep), JSON_VALUES)
GOOD_MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": CONTENT},
    optional={"tool_calls": JSON_VALUES, "reasoning_content": ANY_TEXT}), max_size=4)
# Mostly cases the schema accepts (their values hostile), sometimes anything at all.
GOOD_CASES = st.fixed_dictionaries(
    {"id": st.just("fuzz-case"), "description": st.just("d"), "features": st.just(["chat"]),
     "messages": GOOD_MESSAGES},
    optional={"tools": st.lists(st.dictionaries(ANY_TEXT, JSON_VALUES), max_size=3),
              "kwargs": st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=6), JSON_VALUES, max_size=3),
              "add_generation_prompt": st.booleans(), "now": st.sampled_from(["2025-01-01T00:00:00Z", "x"])})
CASES = st.one_of(GOOD_CASES, GOOD_CASES, GOOD_CASES, st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=6),
                  JSON_VALUES, st.integers(0, 5000).map(_deep))


def test_fuzz_cases(evaluator):
    seen: Counter = Counter()
    started = time.monotonic()
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{{ tools|tojson }}"

    @settings(max_examples=EXAMPLES["cases"], **SETTINGS)
    @given(data=CASES)
    def prop(data):
        try:
            case = case_from_data(data, "<fuzz>")
        except CaseError as exc:
            assert str(exc).startswith("<fuzz>: "), exc
            seen["refused"] += 1
            return
        outcome = evaluator.render(case.request(template, None, None))
        seen[f"loaded, {_check_outcome(outcome, data)}"] += 1

    prop()
    runner = evaluator._harness()
    _record("cases", inputs=sum(seen.values()), outcomes=dict(seen), restarts=runner.restarts,
            harness_peak_mb=_harness_peak_mb(evaluator), seconds=round(time.monotonic() - started, 1))
    assert sum(seen.values()) >= EXAMPLES["cases"] * 0.9
    assert runner.restarts == 0


# -- service request bodies --------------------------------------------------------------------------------

TEMPLATE_IDS = st.one_of(st.sampled_from(["01-ai-yi-1.5-9b-chat", "qwen-qwen2.5-7b-instruct"] * 3), ANY_TEXT,
                         st.sampled_from(["../../etc/passwd", "%2e%2e", "a" * 300]))
CASE_IDS = st.one_of(st.sampled_from(["chat-single-user", "content-parts-image", "tool-call-with-content"] * 2), ANY_TEXT)
# Mostly requests the schema accepts (hostile outputs, surrogates), sometimes anything at all.
GOOD_CHECKS = st.one_of(
    st.fixed_dictionaries({"template": TEMPLATE_IDS, "case": CASE_IDS,
                           "output": st.one_of(ANY_TEXT, st.just("x" * 3_000_000))}),
    st.fixed_dictionaries({"template": TEMPLATE_IDS, "case": CASE_IDS, "raised": ANY_TEXT},
                          optional={"refusal": st.sampled_from(["compile", "raise", "render"])}))
CHECK_BODIES = st.one_of(GOOD_CHECKS, GOOD_CHECKS, st.fixed_dictionaries(
    {}, optional={"template": st.one_of(TEMPLATE_IDS, JSON_VALUES), "case": st.one_of(CASE_IDS, JSON_VALUES),
                  "output": st.one_of(ANY_TEXT, JSON_VALUES), "raised": ANY_TEXT,
                  "refusal": st.one_of(st.sampled_from(["compile", "raise", "render"]), ANY_TEXT),
                  "extra": JSON_VALUES}))
BODIES = st.one_of(
    st.tuples(st.just("/v1/check"), CHECK_BODIES),
    st.tuples(st.just("/v1/check/batch"), st.fixed_dictionaries({"cells": st.lists(CHECK_BODIES, max_size=3)},
                                                               optional={"attribute": JSON_VALUES})),
    st.tuples(st.just("/v1/identify"), st.fixed_dictionaries({}, optional={"template": ANY_TEXT,
                                                                           "sha256": ANY_TEXT})),
    st.tuples(st.just("/v1/goldens"), st.fixed_dictionaries(
        {"template": st.one_of(st.just("{{ messages[0].content }}"), ANY_TEXT, JSON_VALUES)},
        optional={"cases": st.one_of(st.just(["chat-single-user"]), JSON_VALUES), "bos_token": JSON_VALUES})),
    st.tuples(st.sampled_from(["/v1/check", "/v1/goldens", "/v1/identify"]),
              st.one_of(st.binary(max_size=64), st.integers(1, 100000).map(lambda d: b"[" * d + b"]" * d))),
)


@pytest.fixture(scope="module")
def server():
    proc, url = start_service()
    yield proc, url
    stop_service(proc)


def _peak_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) // 1024


def test_fuzz_request_bodies(server):
    proc, url = server
    session = requests.Session()
    session.get(f"{url}/v1/templates", timeout=30).raise_for_status()
    before = _peak_mb(proc.pid)
    seen: Counter = Counter()
    started = time.monotonic()

    @settings(max_examples=EXAMPLES["bodies"], **SETTINGS)
    @given(request=BODIES)
    def prop(request):
        path, body = request
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = session.post(url + path, data=data, headers={"content-type": "application/json"}, timeout=120)
        busy = answer.status_code == 503 and "Retry-After" in answer.headers
        assert answer.status_code < 500 or busy, (path, data[:200], answer.status_code, answer.text[:300])
        assert answer.headers["content-type"].startswith("application/json"), (path, answer.text[:200])
        answer.json()
        seen[answer.status_code] += 1

    prop()
    grown = _peak_mb(proc.pid) - before
    _record("bodies", inputs=sum(seen.values()), statuses={str(k): v for k, v in sorted(seen.items())},
            server_growth_mb=grown, seconds=round(time.monotonic() - started, 1))
    assert sum(seen.values()) >= EXAMPLES["bodies"] * 0.9
    assert grown < SERVER_GROWTH_MB, grown


# -- tokenizer_config.json shapes (lint, corpus import) ----------------------------------------------------------

def _big_template(size: int) -> str:
    return "{{ messages }}" + "x" * size


TEMPLATE_TEXTS = st.one_of(st.just("{{ messages[0].content }}"), ANY_TEXT, st.just("{{ x }"), st.just("a\ud800b"),
                           st.sampled_from([256 * 1024 - 14, 256 * 1024, 300_000]).map(_big_template),
                           st.sampled_from(["{% for m in messages %}{{ m.content }}{% endfor %}", "{% raw %}"]))
NAMED = st.fixed_dictionaries({}, optional={"name": st.one_of(ANY_TEXT, st.just("default"), JSON_VALUES),
                                            "template": st.one_of(TEMPLATE_TEXTS, JSON_VALUES)})
CHAT_TEMPLATES = st.one_of(TEMPLATE_TEXTS, TEMPLATE_TEXTS, st.lists(NAMED, max_size=5),
                           st.integers(60, 70).map(lambda n: [{"name": f"t{i}", "template": "{{ x }}"}
                                                              for i in range(n)]),
                           JSON_VALUES)
TOKENS = st.one_of(st.none(), ANY_TEXT, st.fixed_dictionaries({"content": st.one_of(ANY_TEXT, JSON_VALUES)}),
                   JSON_VALUES)
CONFIGS = st.one_of(
    st.fixed_dictionaries({"chat_template": CHAT_TEMPLATES}, optional={"bos_token": TOKENS, "eos_token": TOKENS}),
    st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=4), JSON_VALUES)


def test_fuzz_tokenizer_configs(tmp_path_factory):
    from conformance.cli.common import UserError
    from conformance.cli.lint import templates_from_file
    from conformance.corpus.manifest import CorpusError

    folder = tmp_path_factory.mktemp("configs")
    seen: Counter = Counter()
    started = time.monotonic()

    @settings(max_examples=EXAMPLES["configs"], **SETTINGS)
    @given(config=CONFIGS, raw=st.one_of(st.none(), st.none(), st.binary(max_size=40)),
           name=st.sampled_from(["tokenizer_config.json", "chat_template.json"]))
    def prop(config, raw, name):
        path = folder / name
        path.write_bytes(raw if raw is not None
                         else json.dumps(config, ensure_ascii=True).encode("ascii"))
        try:
            found = templates_from_file(path, None, None, None)
        except (CorpusError, UserError) as exc:
            assert str(path) in str(exc), exc
            assert len(str(exc)) < 2000, str(exc)[:300]
            seen["refused"] += 1
            return
        assert found and all(len(t.text.encode("utf-8")) <= 256 * 1024 for t in found)
        seen["read"] += 1

    prop()
    _record("configs", inputs=sum(seen.values()), outcomes=dict(seen), seconds=round(time.monotonic() - started, 1))
    assert sum(seen.values()) >= EXAMPLES["configs"] * 0.9


# -- raw request headers ---------------------------------------------------------------------------------------

HEADER_NAMES = st.one_of(st.sampled_from([b"X-A", b"Accept", b"Authorization", b"Content-Length", b"Host",
                                          b"Transfer-Encoding", b"Expect"]),
                         st.binary(min_size=1, max_size=12))
HEADER_VALUES = st.one_of(st.binary(max_size=40),
                          st.tuples(st.sampled_from([1000, 30_000, 65_000, 65_536, 70_000, 200_000]),
                                    st.sampled_from([b"a", b"\xff", b" "])).map(lambda t: t[1] * t[0]))
HEADER_SETS = st.one_of(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6),
                        st.integers(100, 5000).map(lambda n: [(b"X-%d" % i, b"v" * 20) for i in range(n)]))
TARGETS = st.one_of(st.sampled_from([b"/v1/cases/chat-single-user", b"/v1/goldens/01-ai-yi-1.5-9b-chat/chat-system",
                                     b"/openapi.json?x=1", b"/nope"]),
                    st.integers(1000, 100_000).map(lambda n: b"/v1/cases/" + b"a" * n))


def _exchange(url: str, request: bytes) -> tuple:
    import socket

    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def test_fuzz_request_headers(server):
    from conformance.service.limits import MAX_HEADER_BYTES

    proc, url = server
    before = _peak_mb(proc.pid)
    seen: Counter = Counter()
    started = time.monotonic()

    @settings(max_examples=EXAMPLES["headers"], **SETTINGS)
    @given(target=TARGETS, headers=HEADER_SETS)
    def prop(target, headers):
        lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        request = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + lines + b"\r\n"
        head, body = _exchange(url, request)
        assert head.startswith(b"HTTP/1.1 "), (request[:200], head[:200])
        status = int(head.split()[1])
        assert status < 500, (request[:200], head[:300], body[:300])
        if request.index(b"\r\n\r\n") + 4 > MAX_HEADER_BYTES:  # a value may hold an end of headers
            assert status == 431, (len(request), head[:200])
        if status != 200:
            assert b"application/json" in head.lower(), head
            json.loads(body)
        seen[status] += 1

    prop()
    grown = _peak_mb(proc.pid) - before
    _record("headers", inputs=sum(seen.values()), statuses={str(k): v for k, v in sorted(seen.items())},
            server_growth_mb=grown, seconds=round(time.monotonic() - started, 1))
    assert sum(seen.values()) >= EXAMPLES["headers"] * 0.9
    assert grown < SERVER_GROWTH_MB, grown


# -- result store states --------------------------------------------------------------------------------------

DIGEST = "a" * 64
PACK_NAMES = st.sampled_from(["b" * 64 + ".pack", "c" * 64 + ".pack"])
FOREIGN_NAMES = st.sampled_from(["src/app.py", ".git/HEAD", "notes.txt", "x.pack", DIGEST + "/notes.txt",
                                 DIGEST + "/old.pack", "d" * 64 + "/mine.txt", "e" * 63 + "/data"])
PACK_STATES = st.sampled_from(["garbage", "empty", "magic-only", "fifo", "dev-zero", "folder", "valid-other"])
STORE_STATES = st.fixed_dictionaries({
    "root": st.sampled_from(["absent", "empty", "marked", "file", "unmarked"]),
    "foreign": st.lists(FOREIGN_NAMES, max_size=3, unique=True),
    "packs": st.lists(st.tuples(PACK_NAMES, PACK_STATES), max_size=2),
    "ops": st.lists(st.sampled_from(["lookup", "record", "prune", "prune0", "clear", "stats"]), min_size=1,
                    max_size=5)})


def _make_store(root, state) -> dict:
    from conformance.render.store import MAGIC, MARKER_FILE, encode_pack

    foreign = {}
    if state["root"] == "file":
        root.write_text("a file in the store's place")
        return {str(root): "a file in the store's place"}
    if state["root"] == "absent":
        return foreign
    root.mkdir()
    if state["root"] == "marked":
        (root / MARKER_FILE).write_text("chatgold result store\n")
    for name in state["foreign"]:
        if state["root"] == "empty" and "/" not in name:
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"mine: {name}")
        foreign[str(path)] = f"mine: {name}"
    for name, kind in state["packs"]:
        path = root / DIGEST / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            continue
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev-zero":
            os.symlink("/dev/zero", path)
        elif kind == "folder":
            path.mkdir()
        elif kind == "magic-only":
            path.write_bytes(MAGIC)
        elif kind == "valid-other":
            path.write_bytes(encode_pack("f" * 64, name[:64], {}))
        else:
            path.write_bytes(b"" if kind == "empty" else os.urandom(64))
    return foreign


def test_fuzz_store_states(tmp_path_factory):
    from conformance.render.store import ResultStore, StoreUnusable
    from runners.base import Rendered

    seen: Counter = Counter()
    started = time.monotonic()
    counter = iter(range(10**9))
    request = RenderRequest.make("T {{ x }}", [{"role": "user", "content": "hi"}])

    @settings(max_examples=EXAMPLES["stores"], **SETTINGS)
    @given(state=STORE_STATES)
    def prop(state):
        root = tmp_path_factory.mktemp("stores") / f"store{next(counter)}"
        foreign = _make_store(root, state)
        store = ResultStore(root, max_bytes=10**9, verbose=False)
        identity = (DIGEST, {"name": "fuzz"})
        for op in state["ops"]:
            try:
                if op == "lookup":
                    found = store.lookup(DIGEST, [request])
                    assert found in ([None], [Rendered("r")]), found
                elif op == "record":
                    store.record(identity, [request], [Rendered("r")])
                elif op in ("prune", "prune0"):
                    store.prune(0 if op == "prune0" else None)
                elif op == "clear":
                    store.clear()
                else:
                    store.stats()
                seen[op] += 1
            except StoreUnusable as exc:
                assert str(root) in str(exc)
                seen[f"{op} refused"] += 1
        for path, text in foreign.items():
            assert open(path).read() == text, (state, path)
        states["count"] += 1

    states = Counter()
    prop()
    _record("stores", inputs=states["count"], operations=dict(seen), seconds=round(time.monotonic() - started, 1))
    assert states["count"] >= EXAMPLES["stores"] * 0.9
