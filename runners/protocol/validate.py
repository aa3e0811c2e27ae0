"""Check a harness's traffic against the protocol's JSON Schemas (the *.schema.json files beside this module).

Two uses:

- in-process: `CommandRunner(argv, validate=True)` calls `check_request`/`check_response` on every message it
  sends and receives; a response that breaks a schema costs that cell (Errored naming the schema) like garbage;
- from the shell, for an engine author: `chatgold harness validate -- <harness argv...>` (or `python -m
  runners.protocol.validate`) starts the harness, sends probe renders, validates every line both ways and
  exits 0 only when the whole exchange conformed and the harness behaves like a template engine: its output
  follows the template and the data, and it refuses as the protocol says. Outputs that differ from the
  reference's are reported but are the engine's own business (`chatgold check` measures them).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..base import Errored, Raised, Rendered, RenderRequest, Skipped
from .schema import (  # noqa: F401  (the checks are part of this module's interface too)
    REQUEST_KINDS,
    SCHEMA_DIR,
    SCHEMAS,
    check,
    check_request,
    check_response,
    load_schema,
    schema_errors,
    schema_registry,
)


# -- the shell check: `chatgold harness validate` ------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """One probe render. `expected` is the reference's outcome (tests/test_protocol.py holds every one against
    transformers): ("rendered", text) or ("raised", kind, text the message must contain). `strict`: any other
    answer but skipped is a failure (refusals); otherwise a different outcome is the engine's own behaviour,
    reported as DIFF."""

    label: str
    request: "RenderRequest"
    expected: tuple
    strict: bool = False


LOOP = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
HELLO = [{"role": "user", "content": "Hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
# Template sensitivity: two templates, two conversations. An engine's output must change with either.
SENSITIVE = ("A{{ messages[0]['content'] }}", "B{{ messages|length }}")
CONVERSATIONS = ([{"role": "user", "content": "hi"}],
                 [{"role": "user", "content": "bye"}, {"role": "assistant", "content": "ok"}],
                 [{"role": "user", "content": "three"}])


def probes() -> list:
    """Probe renders: the fields that matter (tools, documents, continue_final_message, kwargs, the clock,
    null keys, reasoning aliases), non-ASCII (incl. U+2028, which JavaScript's JSON handling once treated as a
    line break), and one refusal of each kind."""
    from ..base import RenderRequest as R

    unicode_text = "h\u00e9 \u4e16\u754c \U0001F600 \u2028 \"q\"\n"
    return [
        Probe("plain", R.make("{{ bos_token }}" + LOOP + "{{ eos_token }}", HELLO, bos_token="<s>", eos_token="</s>"),
              ("rendered", "<s><user>Hello</s>")),
        Probe("unicode", R.make(LOOP, [{"role": "user", "content": unicode_text}]),
              ("rendered", f"<user>{unicode_text}")),
        Probe("add_generation_prompt", R.make(LOOP + "{% if add_generation_prompt %}<assistant>{% endif %}", HELLO,
                                              add_generation_prompt=True), ("rendered", "<user>Hello<assistant>")),
        Probe("kwargs", R.make("{{ greeting }}, {{ name }}", HELLO, kwargs={"greeting": "hi", "name": "Ada"}),
              ("rendered", "hi, Ada")),
        Probe("kwargs-over-bos_token", R.make("{{ bos_token }}", HELLO, bos_token="<s>", kwargs={"bos_token": "<B>"}),
              ("rendered", "<B>")),
        Probe("undefined-bos_token", R.make("[{{ bos_token }}]{% if bos_token is defined %}defined{% endif %}", HELLO),
              ("rendered", "[]")),
        Probe("tools", R.make("{% for t in tools %}{{ t.function.name }}: {{ t.function.description }};{% endfor %}",
                              HELLO, tools=TOOLS), ("rendered", "get_weather: Weather in a city;")),
        Probe("no-tools-is-none", R.make("{% if tools is none %}none{% else %}set{% endif %}", HELLO),
              ("rendered", "none")),
        Probe("documents", R.make("{% for d in documents %}{{ d.title }}={{ d.text }};{% endfor %}", HELLO,
                                  documents=[{"title": "Paris", "text": "Capital of France."}]),
              ("rendered", "Paris=Capital of France.;")),
        Probe("null-keys-dropped", R.make("{% if messages[0].content is defined %}content{% else %}no content"
                                          "{% endif %}", [{"role": "assistant", "content": None,
                                                           "tool_calls": [{"type": "function"}]}]),
              ("rendered", "no content")),
        Probe("reasoning-alias", R.make("{{ messages[0].reasoning_content }}", [{"role": "assistant", "content": "4",
                                                                               "reasoning": "2+2"}]),
              ("rendered", "2+2")),
        Probe("continue_final_message", R.make("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>"
                                               "{% endfor %}", [{"role": "user", "content": "hi"},
                                                                {"role": "assistant", "content": "The answer is "}],
                                               continue_final_message=True),
              ("rendered", "<user>hi</user><assistant>The answer is ")),
        Probe("tojson", R.make("{{ messages[0]|tojson }}", HELLO), ("rendered", '{"role": "user", "content": "Hello"}')),
        Probe("trim_blocks", R.make("{% for m in messages %}\n  {% if true %}\n{{ m['content'] }}\n{% endif %}\n"
                                    "{% endfor %}", HELLO), ("rendered", "Hello\n")),
        Probe("strftime_now", R.make("{{ strftime_now('%Y-%m-%d %H:%M') }}", HELLO, now="2024-07-04T23:34:56-02:00"),
              ("rendered", "2024-07-05 01:34")),
        Probe("refusal-compile", R.make("{% for %}", HELLO), ("raised", "compile", ""), strict=True),
        Probe("refusal-raise", R.make("{{ raise_exception('nope, not this one') }}", HELLO),
              ("raised", "raise", "nope, not this one"), strict=True),
        Probe("refusal-render", R.make("{{ no_such_function() }}", HELLO), ("raised", "render", ""), strict=True),
    ]


def sensitivity_probes() -> list:
    """(label, request, expected text): the same conversation through two templates, two conversations
    through one template."""
    from ..base import RenderRequest as R

    first, second = SENSITIVE
    return [("template-A", R.make(first, CONVERSATIONS[0]), "Ahi"),
            ("template-B", R.make(second, CONVERSATIONS[0]), "B1"),
            ("template-A-other-conversation", R.make(first, CONVERSATIONS[1]), "Abye")]


def batch_probe() -> list:
    from ..base import RenderRequest as R

    return [R.make(SENSITIVE[0], conversation) for conversation in CONVERSATIONS]


@dataclass
class Validation:
    """What `validate_harness` found; true when the harness conforms."""

    protocol: int = 0
    failures: list = field(default_factory=list)
    differences: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.protocol > 0 and not self.failures


def _shown(outcome) -> str:
    if isinstance(outcome, Rendered):
        return f"rendered {json.dumps(outcome.text, ensure_ascii=False)[:120]}"
    if isinstance(outcome, Raised):
        return f"raised ({outcome.refusal}) {json.dumps(outcome.message, ensure_ascii=False)[:120]}"
    return f"{outcome.kind} {json.dumps(outcome.message, ensure_ascii=False)[:120]}"


def _meets(expected: tuple, outcome, version: int) -> bool:
    if expected[0] == "rendered":
        return isinstance(outcome, Rendered) and outcome.text == expected[1]
    if not isinstance(outcome, Raised) or expected[2] not in outcome.message:
        return False
    return version < 2 or str(outcome.refusal) == expected[1]


# Globals the reference binds (SEMANTICS.md R18, R19) that an engine may not have: the probe that calls each.
GLOBALS = {"refusal-raise": "raise_exception", "strftime_now": "strftime_now"}


def _declined_or_lacking(probe: Probe, outcome, version: int) -> str:
    """Why a refusal that is not the probe's expected one is still the engine's own behaviour (a DIFF), or "".

    Two cases: the engine declines the template as a whole (a refusal of kind `unsupported`, which the protocol
    allows and which never matches a reference refusal), and the engine lacks a global the reference binds
    (raise_exception, strftime_now): calling it fails, a real difference `chatgold check` reports, not a harness
    bug. A refusal that carries raise_exception's message under another kind is still a harness FAIL."""
    if not isinstance(outcome, Raised):
        return ""
    if version >= 2 and str(outcome.refusal) == "unsupported":
        return (f"the engine declines the template as a whole: {_shown(outcome)} (a refusal of kind unsupported "
                f"never matches the reference's)")
    name = GLOBALS.get(probe.label)
    if name is None or (probe.expected[0] == "raised" and probe.expected[2] in outcome.message):
        return ""
    return (f"the engine does not bind `{name}`, a global the reference binds (SEMANTICS.md "
            f"{'R18' if name == 'raise_exception' else 'R19'}): {_shown(outcome)}; templates that call it differ "
            f"in `chatgold check`")


def validate_harness(argv: Sequence[str], timeout: float = 20.0, out=sys.stdout, cwd: Optional[str] = None,
                     start_timeout: float = 60.0) -> Validation:
    """Start the harness, run every probe with schema validation on, print one line per probe. The result is
    true when every line conformed to the protocol and the harness behaves like a template engine (its output
    follows the template and the data; it refuses as the protocol says)."""
    from ..base import RunnerUnavailable
    from ..command import CommandRunner

    result = Validation()
    runner = CommandRunner(list(argv), timeout=timeout, start_timeout=start_timeout, validate=True, cwd=cwd, workers=1)

    def say(status: str, label: str, text: str) -> None:
        print(f"{status:<4} {label}: {text}", file=out)
        if status == "FAIL":
            result.failures.append(f"{label}: {text}")
        elif status == "DIFF":
            result.differences.append(f"{label}: {text}")

    def render(label: str, request):
        """The outcome, or None after reporting a protocol failure (the client restarted the harness)."""
        restarts = runner.restarts
        outcome = runner.render(request)
        if runner.restarts != restarts or isinstance(outcome, Errored):
            detail = getattr(outcome, "detail", "")
            say("FAIL", label, outcome.message + (f"\n     stderr: {detail[-500:]}" if detail else ""))
            return None
        return outcome

    try:
        try:
            info = runner.start()
        except RunnerUnavailable as exc:
            say("FAIL", "start", str(exc))
            return result
        result.protocol = runner.protocol
        sent = getattr(runner, "start_answer", None) or info
        say("ok", "start", f"the harness answered {json.dumps(sent, ensure_ascii=False)}")
        if runner.protocol < 2:
            print("note start: the harness speaks protocol version 1: no refusal kinds, no batch", file=out)
        elif getattr(runner, "build", None):
            print(f"note start: build {runner.build!r}: chatgold reuses this harness's outcomes while the build "
                  f"string stays the same; give a new one whenever the engine or the harness changes", file=out)
        for probe in probes():
            outcome = render(probe.label, probe.request)
            if outcome is None:
                continue
            if _meets(probe.expected, outcome, runner.protocol):
                say("ok", probe.label, _shown(outcome))
            elif isinstance(outcome, Skipped):  # declining is always allowed: never a pass, never a failure
                say("SKIP", probe.label, outcome.message)
            elif _declined_or_lacking(probe, outcome, runner.protocol):
                say("DIFF", probe.label, _declined_or_lacking(probe, outcome, runner.protocol))
            elif probe.strict:
                wanted = f"a refusal of kind {probe.expected[1]}" + (
                    f" carrying {probe.expected[2]!r}" if probe.expected[2] else "")
                say("FAIL", probe.label, f"expected {wanted}, got {_shown(outcome)}")
            else:
                say("DIFF", probe.label, f"the reference gives {json.dumps(probe.expected[1], ensure_ascii=False)}, "
                                         f"this engine {_shown(outcome)}")
        _check_sensitivity(render, say)
        if runner.protocol >= 2:
            _check_batch(runner, render, say)
    finally:
        runner.close()
    if result.differences:
        print(f"{len(result.differences)} probe(s) differ from the reference: the engine's own behaviour, which "
              f"`chatgold check` measures", file=out)
    print("conforms" if result else "does NOT conform", file=out)
    return result


def _check_sensitivity(render, say) -> None:
    texts = {}
    for label, request, expected in sensitivity_probes():
        outcome = render(label, request)
        if outcome is None:
            continue
        if isinstance(outcome, Skipped):
            say("SKIP", label, f"the harness declined ({outcome.message}): template sensitivity not shown")
            continue
        if not isinstance(outcome, Rendered):
            say("FAIL", label, f"a one-line template must render, got {_shown(outcome)}")
            continue
        texts[label] = outcome.text
        say("ok" if outcome.text == expected else "DIFF", label, _shown(outcome))
    a, b, c = (texts.get(label) for label, _, _ in sensitivity_probes())
    if a is not None and b is not None and a == b:
        say("FAIL", "template-sensitivity", f"two different templates rendered the same text {a!r}: the harness "
                                            f"ignores the template")
    if a is not None and c is not None and a == c:
        say("FAIL", "data-sensitivity", f"two different conversations rendered the same text {a!r}: the harness "
                                        f"ignores the conversation")


def _check_batch(runner, render, say) -> None:
    requests = batch_probe()
    restarts = runner.restarts
    together = list(runner.render_many(requests))  # one batch message: one template, three conversations
    if runner.restarts != restarts or any(isinstance(o, Errored) for o in together):
        bad = next((o for o in together if isinstance(o, Errored)), None)
        say("FAIL", "batch", bad.message if bad else "the batch was not answered as the protocol says")
        return
    alone = [render(f"batch-{i}", request) for i, request in enumerate(requests)]
    if any(o is None for o in alone):
        return
    if together != alone:
        say("FAIL", "batch", f"a batch answered {[_shown(o) for o in together]}, the same renders one by one "
                             f"{[_shown(o) for o in alone]}")
        return
    say("ok", "batch", f"{len(requests)} conversations, one template: the same outcomes as one by one")
    keep = (getattr(runner, "start_answer", None) or {}).get("keep")
    if not keep:
        return
    restarts = runner.restarts
    again = list(runner.render_many(requests))  # the same conversations: sent as {"ref": K} this time
    if runner.restarts != restarts or again != together:
        say("FAIL", "keep", f"conversations sent by reference answered {[_shown(o) for o in again]}, sent in full "
                            f"{[_shown(o) for o in together]}")
    else:
        say("ok", "keep", f"keeps {keep} conversations: the same outcomes sent by reference")


EXIT_CODES = "exit status: 0 the harness conforms; 1 it does not (a FAIL line says why); 2 bad usage"


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m runners.protocol.validate") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, epilog=EXIT_CODES,
        description="Check a harness against the chatgold harness protocol (runners/protocol/PROTOCOL.md): start "
                    "it, send probe renders (tools, documents, continue_final_message, kwargs, null keys, reasoning "
                    "aliases, the clock, one refusal of each kind, template and data sensitivity, a batch), "
                    "validate every line against the schemas. A probe whose output differs from the reference is "
                    "reported (DIFF) but is the engine's own business; a harness that ignores the template, answers "
                    "a refusal as something else, or breaks the protocol FAILs.")
    add_timeouts(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the harness command line, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the harness command line after --")
    return 0 if validate_harness(command, timeout=args.timeout, start_timeout=args.start_timeout) else 1


def add_timeouts(parser) -> None:
    parser.add_argument("--timeout", type=float, default=20.0, metavar="S",
                        help="seconds the harness may take per response line (default 20)")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                        help="seconds the harness may take to answer start (default 60)")


if __name__ == "__main__":
    sys.exit(main())
