"""An HF-faithful jinja2 harness with plausible engine bugs planted on purpose, for the bug library test.

The engine is runners/examples/plain_jinja2.py (the reference's rules, SEMANTICS.md, on plain jinja2) served by
runners/examples/minimal_harness.py (protocol versions 1 and 2); each `--bug NAME` switches one bug on. With
no bug it reproduces the reference. `--protocol 1` makes it speak version 1 only.

    python tests/harnesses/buggy_jinja2.py [--protocol 1|2] [--bug NAME]...
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "runners", "examples"))

import jinja2  # noqa: E402
import jinja2.runtime  # noqa: E402
from jinja2.filters import do_default, do_replace, do_trim  # noqa: E402

# name -> what the engine gets wrong (each is a bug some engine has had, or easily could)
BUGS = {
    "tojson-sorts-keys": "tojson sorts object keys",
    "tojson-escapes-html": "tojson escapes <, >, & and ' as \\u00XX (jinja2's HTML-safe dumps)",
    "tojson-ignores-indent": "tojson(indent=N) prints on one line",
    "no-trim-blocks": "the environment keeps trim_blocks off",
    "no-lstrip-blocks": "the environment keeps lstrip_blocks off",
    "no-raise-exception": "the raise_exception global is missing",
    "no-strftime-now": "the strftime_now global is missing",
    "null-keys-kept": "message keys whose value is null are passed to the template as none (R4 not applied)",
    "null-content-empty": "a message's null content is passed as the empty string",
    "loop-last-early": "loop.last is true one item early",
    "trim-keeps-newlines": "|trim strips spaces only, not newlines or tabs",
    "string-iteration-refused": "a for loop over a string refuses",
    "iterable-false-on-strings": "`is iterable` is false for strings",
    "get-default-ignored": "dict.get(key, default) returns none for a missing key",
    "default-boolean-ignored": "default(x, true) treats its second argument as false",
    "str-plus-list-allowed": "a string + a list concatenates the list's text instead of refusing",
    "items-sorted": "dict.items() yields keys sorted",
    "length-of-none-zero": "|length of none is 0 instead of a refusal",
    "final-assistant-continued": "a final assistant message is always continued: the output is cut after its "
                                 "content even when the request does not ask to continue it",
    "bos-doubled": "the engine prepends bos_token to an output that already starts with it",
    "generation-prompt-ignored": "add_generation_prompt is always false",
    "percent-format-ignored": "`'...' % x` returns the format string unchanged",
    "booleans-lowercase": "true and false print as `true` and `false`",
    "replace-first-only": "|replace replaces the first occurrence only",
    "capitalize-keeps-rest": "|capitalize leaves the rest of the string as it was",
    "no-string-test": "the `string` test is missing",
    "loop-index-from-zero": "loop.index counts from 0",
    "no-namespace": "the namespace() global is missing",
    "eos-token-unbound": "eos_token is not passed to the template",
    "tool-arguments-parsed": "tool call arguments given as a JSON string reach the template parsed into an object",
    "developer-as-system": "a developer message reaches the template with the role system",
    "empty-tools-as-none": "an empty tools list reaches the template as none",
    "continue-rebuilt": "a continued final message is not rendered by the template: the messages before it are, "
                        "with the generation prompt, and its text is appended",
    "join-ignores-separator": "|join(d) joins with nothing between the items",
    "lower-ascii-only": "|lower leaves letters outside ASCII as they were",
    "length-counts-bytes": "|length of a string counts its UTF-8 bytes, not its characters",
    "no-caller-variables": "the request layer passes the template none of the caller's own variables (kwargs)",
    "null-tools-unbound": "a request without tools leaves `tools` unbound instead of binding none (R7 not applied)",
    "message-keys-dropped": "the request layer rebuilds each message from its role and content only",
    "one-part-content-flattened": "a content list of one text part reaches the template as that part's text",
    "text-parts-joined": "a message's several text parts reach the template as one part, joined with a space",
    "date-string-bound": "the request layer binds `date_string` (to a fixed date) where the request does not set it",
    "data-keys-sorted": "the request layer hands the template every mapping of messages, tools and documents with its "
                        "keys sorted (a JSON value type without preserved order)",
    "tool-calls-as-content": "a message with tool calls and no content reaches the template with the calls as its "
                             "content (compact JSON) and no `tool_calls` (a request layer of plain text messages)",
    "system-folded": "a capability probe finds the template prints no system message: a leading system message "
                     "then reaches it folded into the next one's content, joined with a newline",
    "content-parts-probed": "a capability probe finds the template prints a one-part content list's text but not a "
                            "string content: every string content then reaches it as one text part",
    "generation-tags-deleted": "the exact texts `{% generation %}` and `{% endgeneration %}` are deleted from the "
                               "template before it compiles (a source rewrite, as TGI's)",
    "empty-template-as-chatml": "an empty template is taken for no template: a built-in ChatML is rendered in its "
                                "place (as llama.cpp does)",
    "reasoning-not-aliased": "a message's reasoning reaches the template only under the name the request used "
                             "(R11 not applied)",
}


def _plant(bugs: frozenset) -> None:
    import minimal_harness
    import plain_jinja2

    env = plain_jinja2.environment()
    if "no-trim-blocks" in bugs:
        env.trim_blocks = False
    if "no-lstrip-blocks" in bugs:
        env.lstrip_blocks = False
    original_tojson = plain_jinja2.tojson
    if bugs & {"tojson-sorts-keys", "tojson-escapes-html", "tojson-ignores-indent"}:
        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            if "tojson-ignores-indent" in bugs:
                indent = None
            if "tojson-sorts-keys" in bugs:
                sort_keys = True
            text = original_tojson(value, ensure_ascii, indent, separators, sort_keys)
            if "tojson-escapes-html" in bugs:
                for char in "<>&'":
                    text = text.replace(char, "\\u%04x" % ord(char))
            return text
        env.filters["tojson"] = tojson
    if "no-raise-exception" in bugs:
        env.globals.pop("raise_exception")
    if "no-string-test" in bugs:
        env.tests.pop("string")
    if "no-namespace" in bugs:
        env.globals.pop("namespace")
    if "no-strftime-now" in bugs:
        env.globals.pop("strftime_now")
    if "trim-keeps-newlines" in bugs:
        env.filters["trim"] = lambda value, chars=None: (value.strip(" ") if isinstance(value, str) and chars is None
                                                          else do_trim(value, chars))
    if "iterable-false-on-strings" in bugs:
        original = env.tests["iterable"]
        env.tests["iterable"] = lambda value: not isinstance(value, str) and original(value)
    if "default-boolean-ignored" in bugs:
        env.filters["default"] = env.filters["d"] = (
            lambda value, default_value="", boolean=False: do_default(value, default_value, False))
    if "length-of-none-zero" in bugs:
        original_length = env.filters["length"]
        env.filters["length"] = env.filters["count"] = lambda value: 0 if value is None else original_length(value)
    if "replace-first-only" in bugs:
        env.filters["replace"] = (lambda eval_ctx, s, old, new, count=None:
                                  do_replace(eval_ctx, s, old, new, 1 if count is None else count))
        env.filters["replace"].jinja_pass_arg = jinja2.utils._PassArg.eval_context
    if "join-ignores-separator" in bugs:
        original_join = env.filters["join"]
        env.filters["join"] = (lambda eval_ctx, value, d="", attribute=None:
                               original_join(eval_ctx, value, "", attribute))
        env.filters["join"].jinja_pass_arg = jinja2.utils._PassArg.eval_context
    if "lower-ascii-only" in bugs:
        env.filters["lower"] = lambda s: "".join(c.lower() if c.isascii() else c for c in str(s))
    if "length-counts-bytes" in bugs:
        counted = env.filters["length"]
        env.filters["length"] = env.filters["count"] = (
            lambda value: len(str(value).encode("utf-8")) if isinstance(value, str) else counted(value))
    if "capitalize-keeps-rest" in bugs:
        env.filters["capitalize"] = lambda s: str(s)[:1].upper() + str(s)[1:]
    if "booleans-lowercase" in bugs:
        env.finalize = lambda value: ("true" if value is True else "false" if value is False else value)
    if bugs & {"str-plus-list-allowed", "percent-format-ignored"}:
        ops = {"+"} if "str-plus-list-allowed" in bugs else set()
        ops |= {"%"} if "percent-format-ignored" in bugs else set()
        env.intercepted_binops = frozenset(ops)
        base_binop = env.call_binop

        def call_binop(context, operator, left, right):
            if operator == "+" and isinstance(left, str) and isinstance(right, list):
                return left + str(right)
            if operator == "%" and isinstance(left, str):
                return left
            return base_binop(context, operator, left, right)
        env.call_binop = call_binop
    if bugs & {"get-default-ignored", "items-sorted"}:
        base_call = env.call

        def call(__context, __obj, *args, **kwargs):
            owner = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, dict):
                if name == "get" and len(args) == 2 and "get-default-ignored" in bugs:
                    return owner.get(args[0])
                if name == "items" and not args and "items-sorted" in bugs:
                    return sorted(owner.items(), key=lambda kv: str(kv[0]))
            return base_call(__context, __obj, *args, **kwargs)
        env.call = call
    if bugs & {"loop-last-early", "string-iteration-refused", "loop-index-from-zero"}:
        class Loop(jinja2.runtime.LoopContext):
            def __init__(self, iterable, *args, **kwargs):
                if "string-iteration-refused" in bugs and isinstance(iterable, str):
                    raise TypeError("'str' object is not iterable in a for loop")
                super().__init__(iterable, *args, **kwargs)

            if "loop-last-early" in bugs:
                @property
                def last(self):
                    return self.index0 + 2 >= self.length

            if "loop-index-from-zero" in bugs:
                @property
                def index(self):
                    return self.index0
        jinja2.runtime.LoopContext = Loop
    plain_jinja2._ENV = env
    plain_jinja2._COMPILED.clear()

    if "null-keys-kept" in bugs:
        plain_jinja2.drop_nulls = lambda message: message
    if "reasoning-not-aliased" in bugs:
        plain_jinja2._alias = lambda message: message
    if "null-tools-unbound" in bugs:
        compile_template = plain_jinja2.compile_template

        class Unbinding:
            def __init__(self, template):
                self.template = template

            def render(self, variables):
                if variables.get("tools") is None:
                    variables = {k: v for k, v in variables.items() if k != "tools"}
                return self.template.render(variables)

        plain_jinja2.compile_template = lambda source: Unbinding(compile_template(source))
    render = plain_jinja2.render

    def buggy(template, bos_token, eos_token, conversation):
        conversation = dict(conversation)
        if "empty-template-as-chatml" in bugs and template == "":
            template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
        if "generation-tags-deleted" in bugs:
            template = template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
        if "generation-prompt-ignored" in bugs:
            conversation["add_generation_prompt"] = False
        messages = conversation.get("messages") or []
        if "eos-token-unbound" in bugs:
            eos_token = None
        if "no-caller-variables" in bugs:
            conversation["kwargs"] = {}
        if "date-string-bound" in bugs and "date_string" not in (conversation.get("kwargs") or {}):
            conversation["kwargs"] = dict(conversation.get("kwargs") or {}, date_string="01 Jan 2000")
        if "data-keys-sorted" in bugs:
            for top in ("messages", "tools", "documents"):
                if conversation.get(top) is not None:
                    conversation[top] = _sorted_keys(conversation[top])
            messages = conversation.get("messages") or []
        if "empty-tools-as-none" in bugs and conversation.get("tools") == []:
            conversation["tools"] = None
        if bugs & REQUEST_LAYER and all(isinstance(m, dict) for m in messages):
            messages = [_adapted(m, bugs) for m in messages]
            conversation["messages"] = messages
        if "system-folded" in bugs and len(messages) > 1 and all(isinstance(m, dict) for m in messages[:2]) \
                and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str) \
                and isinstance(messages[1].get("content"), str) and \
                not _probe_prints(render, template, [{"role": "system", "content": PROBE},
                                                     {"role": "user", "content": "x"}]):
            messages = [dict(messages[1], content=messages[0]["content"] + "\n" + messages[1]["content"])] + \
                list(messages[2:])
            conversation["messages"] = messages
        if "content-parts-probed" in bugs and all(isinstance(m, dict) for m in messages) and \
                any(isinstance(m.get("content"), str) for m in messages) and \
                not _probe_prints(render, template, [{"role": "user", "content": PROBE}]) and \
                _probe_prints(render, template, [{"role": "user", "content": [{"type": "text", "text": PROBE}]}]):
            messages = [dict(m, content=[{"type": "text", "text": m["content"]}])
                        if isinstance(m.get("content"), str) else m for m in messages]
            conversation["messages"] = messages
        if "null-content-empty" in bugs and all(isinstance(m, dict) for m in messages):
            fixed = []
            for message in messages:
                if "null-content-empty" in bugs and "content" in message and message["content"] is None:
                    message = dict(message, content="")
                fixed.append(message)
            conversation["messages"] = fixed
        final = messages[-1] if messages and isinstance(messages[-1], dict) else None
        if "continue-rebuilt" in bugs and conversation.get("continue_final_message") and final is not None \
                and isinstance(final.get("content"), str):
            before = dict(conversation, messages=conversation["messages"][:-1], add_generation_prompt=True,
                          continue_final_message=False)
            # as llama.cpp does, an empty conversation before the final message is rendered, not refused
            checked = plain_jinja2._check_call
            plain_jinja2._check_call = lambda kwargs, messages, *flags: checked(kwargs, messages or [{}], *flags)
            try:
                outcome = render(template, bos_token, eos_token, before)
            finally:
                plain_jinja2._check_call = checked
            if outcome[0] == "rendered":
                outcome = ("rendered", outcome[1] + final["content"])
        else:
            outcome = render(template, bos_token, eos_token, conversation)
        if ("final-assistant-continued" in bugs and outcome[0] == "rendered" and final is not None
                and final.get("role") == "assistant" and isinstance(final.get("content"), str)
                and final["content"] and final["content"] in outcome[1]):
            content = final["content"]
            outcome = ("rendered", outcome[1][:outcome[1].rindex(content) + len(content)])
        if ("bos-doubled" in bugs and outcome[0] == "rendered" and bos_token
                and outcome[1].startswith(bos_token)):
            outcome = ("rendered", bos_token + outcome[1])
        return outcome

    minimal_harness.render_with_engine = buggy


PROBE = "CAPABILITY_PROBE_7f3"


_PROBED: dict = {}


def _probe_prints(render, template: str, messages: list) -> bool:
    """Whether the template, given these probe messages alone, prints PROBE (as llama.cpp's capability probe
    decides what a template supports); once per template and probe, as llama.cpp probes once at load."""
    key = (template, json.dumps(messages))
    if key not in _PROBED:
        if len(_PROBED) > 4096:   # a reduction's candidate templates: keep the memo bounded
            _PROBED.clear()
        outcome = render(template, None, None, {"messages": messages, "add_generation_prompt": False})
        _PROBED[key] = outcome[0] == "rendered" and PROBE in outcome[1]
    return _PROBED[key]


REQUEST_LAYER = frozenset({"tool-arguments-parsed", "developer-as-system", "message-keys-dropped",
                           "one-part-content-flattened", "text-parts-joined", "tool-calls-as-content"})


def _sorted_keys(value):
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def _adapted(message: dict, bugs: frozenset) -> dict:
    """A message as the request layer of an engine with these bugs hands it over."""
    if "message-keys-dropped" in bugs:
        message = {k: v for k, v in message.items() if k in ("role", "content")}
    content = message.get("content")
    texts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"] \
        if isinstance(content, list) else []
    if "text-parts-joined" in bugs and len(texts) > 1 and len(texts) == len(content) and \
            all(isinstance(t, str) for t in texts):
        message = dict(message, content=[{"type": "text", "text": " ".join(texts)}])
    elif "one-part-content-flattened" in bugs and len(texts) == 1 == len(content) and isinstance(texts[0], str):
        message = dict(message, content=texts[0])
    if "developer-as-system" in bugs and message.get("role") == "developer":
        message = dict(message, role="system")
    calls = message.get("tool_calls")
    if "tool-calls-as-content" in bugs and isinstance(calls, list) and "content" not in message:
        message = {key: value for key, value in message.items() if key != "tool_calls"}
        message["content"] = json.dumps(calls, separators=(",", ":"))
        calls = None
    if "tool-arguments-parsed" in bugs and isinstance(calls, list):
        fixed = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    call = dict(call, function=dict(function, arguments=json.loads(function["arguments"])))
                except ValueError:
                    pass
            fixed.append(call)
        message = dict(message, tool_calls=fixed)
    return message


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", action="append", default=[], choices=sorted(BUGS))
    parser.add_argument("--protocol", type=int, choices=(1, 2), default=2)
    options = parser.parse_args()
    bugs = frozenset(options.bug)
    _plant(bugs)
    import minimal_harness

    minimal_harness.VERSIONS = (1,) if options.protocol == 1 else (1, 2)
    minimal_harness.INFO = {"name": "buggy-jinja2" + "".join(f"+{b}" for b in sorted(bugs)), "version": "1",
                            "language": "python", "homepage": "tests/harnesses/buggy_jinja2.py"}
    minimal_harness.main()


if __name__ == "__main__":
    main()
