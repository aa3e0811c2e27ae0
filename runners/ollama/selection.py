"""Which template Ollama renders a GGUF's chat with: our own implementation of its rules, read at tag
v0.33.0-rc2 (commit fb307609) of github.com/ollama/ollama, whose template/index.json and *.gotmpl files are
byte-identical to the v0.33.2 data (commit b79067b0) imported in runners/ollama/data.

1. Architecture renderers (server/create.go:795-817): `ollama create` sets a hand-written renderer from the
   GGUF's `general.architecture` (gemma4 -> gemma4, laguna -> laguna, nemotron_h/nemotron_h_moe/
   nemotron_h_omni -> nemotron-3-nano); renderPrompt (server/prompt.go:135-143) then renders with it and no
   template is read. Only known when the architecture is (a GGUF, not a bare template).
2. Template detection (server/model.go:93-125, template/template.go:72-92): the GGUF's
   `tokenizer.chat_template` is compared with every entry of template/index.json in file order by Levenshtein
   distance over code points (github.com/agnivade/levenshtein v1.1.1, go.mod:23); the first entry with the
   strictly smallest distance wins, and only when that distance is under 100. Its `<name>.gotmpl` becomes the
   model's Go TEMPLATE.
3. Preferring the GGUF's own template (server/images.go:790-795 and 187-307): at model load, when a detected Go
   template has fewer capabilities than the GGUF's Jinja, or as many but without a tool round trip the Jinja
   has, Ollama keeps the Jinja (PreferChatTemplate), i.e. the llama.cpp path. OLLAMA_GO_TEMPLATE, Modelfile
   RENDERER/PARSER and the gpt-oss harmony path change this; the defaults are modelled.
4. Otherwise (no match, or the Jinja preferred), llama-server renders the GGUF's Jinja (server/routes.go:
   2365-2385: Jinja is disabled only when Ollama renders itself).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

DATA = Path(__file__).resolve().parent / "data"
CUTOFF = 100  # template/template.go:87: `if score < 100`

ROUTE_GO = "go-template"          # Ollama's curated Go template, rendered by Go text/template
ROUTE_PREFER = "gguf-preferred"   # a Go template was detected, but the GGUF's Jinja is kept (llama.cpp path)
ROUTE_FALLBACK = "fallback"       # no index entry near enough: the GGUF's Jinja through llama.cpp
ROUTE_RENDERER = "renderer"       # an architecture's hand-written renderer
ROUTES = (ROUTE_GO, ROUTE_PREFER, ROUTE_FALLBACK, ROUTE_RENDERER)

# server/create.go:800-816 (gemma4RendererLegacy is "gemma4": server/renderer_resolution.go:11).
ARCHITECTURE_RENDERERS = {"gemma4": "gemma4", "laguna": "laguna", "nemotron_h": "nemotron-3-nano",
                          "nemotron_h_moe": "nemotron-3-nano", "nemotron_h_omni": "nemotron-3-nano"}


@dataclass(frozen=True)
class Choice:
    route: str
    template: Optional[str]    # the index entry (Go template name) detection picked, or None
    distance: Optional[int]    # its distance, or None when no entry is under the cutoff
    renderer: Optional[str] = None
    reason: str = ""

    def facts(self) -> dict:
        facts = {"ollama.route": self.route, "ollama.template": self.template, "ollama.distance": self.distance}
        if self.renderer:
            facts["ollama.renderer"] = self.renderer
        return facts

    def to_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=1)
def index() -> tuple:
    """(name, Jinja text) of template/index.json, in file order."""
    entries = json.loads((DATA / "index.json").read_text(encoding="utf-8"))
    return tuple((entry["name"], entry["template"]) for entry in entries)


@functools.lru_cache(maxsize=None)
def go_template(name: str) -> str:
    """The curated Go template's text, line endings normalised as template.go:42-43 does."""
    return (DATA / f"{name}.gotmpl").read_text(encoding="utf-8").replace("\r\n", "\n")


def bounded_distance(a: str, b: str, cut: int = CUTOFF) -> int:
    """The Levenshtein distance of a and b (code points) when it is below `cut`, else `cut`.

    Only the diagonal band |i - j| < cut can hold values below `cut`, and row minima never decrease, so the
    band is filled row by row and the walk stops once a whole row has reached `cut`."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) >= cut:
        return cut
    if not a:
        return min(len(b), cut)
    width = len(b)
    previous = [min(j, cut) for j in range(width + 1)]
    for i, char in enumerate(a, start=1):
        low, high = max(1, i - cut + 1), min(width, i + cut - 1)
        current = [cut] * (width + 1)
        current[0] = min(i, cut)
        best = current[0] if low == 1 else cut
        left = current[low - 1]
        for j in range(low, high + 1):
            value = previous[j - 1] + (char != b[j - 1])
            above = previous[j] + 1
            if above < value:
                value = above
            if left + 1 < value:
                value = left + 1
            if value > cut:
                value = cut
            current[j] = value
            left = value
            if value < best:
                best = value
        if best >= cut:
            return cut
        previous = current
    return min(previous[width], cut)


@functools.lru_cache(maxsize=256)
def _histogram(text: str) -> Counter:
    return Counter(text)


def histogram_bound(a: Counter, b: Counter) -> int:
    """A lower bound of the Levenshtein distance from the characters' counts alone: a substitution removes
    at most one surplus character of each side, an insertion or deletion one of one side, so the distance is
    at least the larger side's surplus (which is also at least the length difference)."""
    surplus_a = surplus_b = 0
    for char, count in a.items():
        other = b.get(char, 0)
        if count > other:
            surplus_a += count - other
    for char, count in b.items():
        other = a.get(char, 0)
        if count > other:
            surplus_b += count - other
    return max(surplus_a, surplus_b)


def detect(template: str, entries: Optional[tuple] = None) -> tuple:
    """template.Named: (entry name, distance) of the first strictly nearest entry of the index (or of
    `entries`, (name, text) pairs) under the cutoff, or (None, None). An entry whose lower bound is already
    no nearer than the best so far is passed over: the choice is the same, without its quadratic distance."""
    best_name, best = None, CUTOFF
    counts = Counter(template)
    for name, candidate in index() if entries is None else entries:
        if abs(len(candidate) - len(template)) >= best:
            continue  # cannot be strictly nearer than the best so far
        if histogram_bound(counts, _histogram(candidate)) >= best:
            continue
        distance = bounded_distance(template, candidate, best)
        if distance < best:
            best_name, best = name, distance
    return (best_name, best) if best_name is not None else (None, None)


# -- capabilities (server/images.go:187-307) --------------------------------------------------------------

def jinja_capabilities(template: str) -> set:
    """chatTemplateCapabilities (images.go:187-234): tools and thinking, by substrings of the Jinja text."""
    capabilities = set()
    if "tools" in template or "tool_call" in template:
        capabilities.add("tools")
    splits = "content.split('</think>')" in template or 'content.split("</think>")' in template
    if ("<think>" in template and "</think>" in template) or (
            splits and "reasoning_content" not in template and "<SPECIAL_12>" not in template):
        capabilities.add("thinking")
    return capabilities


def jinja_has_tool_round_trip(template: str) -> bool:
    """chatTemplateHasToolRoundTrip (images.go:206-221)."""
    if "tools" not in template and "tool_call" not in template:
        return False
    if "tool_calls" not in template and "assistant_tool_call" not in template:
        return False
    markers = ("tool_response", "tool_results", "role'] == 'tool'", "role'] == \"tool\"", "role\"] == 'tool'",
               "role\"] == \"tool\"", "message.role == 'tool'", "message.role == \"tool\"", "ipython")
    return any(marker in template for marker in markers)


_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
_FIELD = re.compile(r"\.([A-Za-z_]\w*)")


def go_template_vars(source: str) -> set:
    """Template.Vars (template.go:171-189): field and variable names the actions use, lower-cased. Read from
    the actions' text, string literals removed (every link of a chain such as `$m.ToolCalls` counts, as in
    the parse tree's identifiers); the Go harness computes the same set from the parse tree when it renders."""
    names = set()
    for action in _ACTION.findall(source):
        names.update(name.lower() for name in _FIELD.findall(_STRING.sub("", action)))
    return names


def go_capabilities(source: str) -> set:
    """goTemplateCapabilities (images.go:236-261). Thinking needs thinking tags inferred from the template
    (thinking.InferTags); none of the imported templates mentions thinking, so it never applies here."""
    names = go_template_vars(source)
    capabilities = set()
    if "tools" in names:
        capabilities.add("tools")
    if "suffix" in names:
        capabilities.add("insert")
    return capabilities


def go_has_tool_round_trip(source: str) -> bool:
    """goTemplateHasToolRoundTrip (images.go:263-277)."""
    names = go_template_vars(source)
    if "tools" not in names or "toolcalls" not in names:
        return False
    return 'eq .Role "tool"' in source or "tool_response" in source or "TOOL_RESULTS" in source


def prefers_jinja(template: str, go_source: str) -> bool:
    """shouldPreferChatTemplate (images.go:295-307) with the defaults of images.go:793 (no OLLAMA_GO_TEMPLATE,
    no RENDERER/PARSER, not harmony)."""
    jinja, go = jinja_capabilities(template), go_capabilities(go_source)
    if len(jinja) > len(go):
        return not go_has_tool_round_trip(go_source) or jinja_has_tool_round_trip(template)
    if jinja != go or "tools" not in jinja or "tools" not in go:
        return False
    return jinja_has_tool_round_trip(template) and not go_has_tool_round_trip(go_source)


def choose(template: str, architecture: Optional[str] = None) -> Choice:
    """What a default `ollama create` + chat does with a GGUF holding this chat template (and architecture)."""
    renderer = ARCHITECTURE_RENDERERS.get(architecture or "")
    if renderer:
        return Choice(ROUTE_RENDERER, None, None, renderer,
                      f"architecture {architecture} selects Ollama's hand-written {renderer} renderer")
    name, distance = detect(template)
    if name is None:
        return Choice(ROUTE_FALLBACK, None, None,
                      reason=f"no index entry within distance {CUTOFF}: the GGUF's Jinja via llama.cpp")
    if prefers_jinja(template, go_template(name)):
        return Choice(ROUTE_PREFER, name, distance,
                      reason=f"detected {name} (distance {distance}), but the GGUF's Jinja has more capabilities "
                             "or a tool round trip the Go template lacks: the Jinja via llama.cpp")
    return Choice(ROUTE_GO, name, distance, reason=f"detected {name} (distance {distance}): its Go template")


def data_digest() -> str:
    """The imported index and Go templates, by content."""
    digest = hashlib.sha256()
    for path in sorted(DATA.iterdir()):
        for part in (path.name.encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _choice_salt() -> bytes:
    # A choice follows from the template, the architecture, the imported data and this module's rules.
    return hashlib.sha256(data_digest().encode() + Path(__file__).read_bytes()).digest()


def _choice_path(template: str, architecture: Optional[str]) -> Path:
    from ..versions import cache_root

    key = hashlib.sha256(_choice_salt() + (architecture or "").encode() + b"\0" + template.encode("utf-8",
                                                                                                   "surrogatepass"))
    name = key.hexdigest()
    return cache_root() / "ollama-choices" / name[:2] / f"{name}.json"


@functools.lru_cache(maxsize=4096)
def choose_cached(template: str, architecture: Optional[str] = None) -> Choice:
    """choose(), remembered on disk: detection is a bounded edit distance to every index entry (about 10 ms a
    template in Python), and a warm gate asks it for every template of the corpus. A record that cannot be
    read is computed again; a cache that cannot be written costs only the time."""
    path = _choice_path(template, architecture)
    try:
        return Choice(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    choice = choose(template, architecture)
    staged = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp",
                                         delete=False) as handle:
            staged = handle.name
            json.dump(choice.to_dict(), handle)
        os.replace(staged, path)
    except OSError:
        if staged is not None:
            with contextlib.suppress(OSError):
                os.unlink(staged)
    return choice
