"""Template families: which model line a template belongs to, which templates are variants of one another.

`majority_family` names the family by a vote of every name the template goes by (its origins' names, the
model repos that ship it, the tokenizer files that carry it): a template shared by 38 Gemma-3 fine-tunes is
a Gemma-3 template whichever repo listed it first. Without a strict majority `detect_family` decides: the
template's own name, then the most common family among its repos, then the special tokens in its text.
`group_variants` clusters templates whose normalised text is nearly the same
(token shingles, Jaccard similarity), within a family and across families, so one sees e.g. every
fine-tune's copy of the Qwen2.5 template next to the original. `diff_templates` shows two templates' difference.
"""
from __future__ import annotations

import difflib
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

UNKNOWN = "unknown"

# (family, pattern on a lowercased model name). Order matters: the first match wins, so model lines whose
# names embed another line's name come first (DeepSeek-R1-Distill-Llama, Idefics3-8B-Llama3, ...).
NAME_RULES: list[tuple[str, str]] = [
    ("gpt-oss", r"gpt-?oss"),
    ("deepseek-coder", r"deepseek-coder-(?:1\.3|5\.7|6\.7|7|33)b"),
    ("deepseek", r"deepseek"),
    ("idefics", r"idefics"),
    ("smolvlm", r"smolvlm"),
    ("smollm", r"smollm"),
    ("llava", r"llava"),
    ("nemotron", r"nemotron"),
    ("hermes", r"hermes"),
    ("llama4", r"llama[-_ ]?4"),
    ("llama3", r"llama[-_ ]?3"),
    ("llama2", r"llama[-_ ]?2|codellama"),
    ("qwen3", r"qwen[-_ ]?3"),
    ("qwen2.5", r"qwen[-_ ]?2[._]5|qwen[-_]?25|qwq"),
    ("qwen2", r"qwen[-_ ]?(?:2|1\.5)|qwen"),
    ("gemma4", r"gemma[-_ ]?4"),
    ("gemma3", r"gemma[-_ ]?3"),
    ("gemma", r"gemma"),
    ("phi4", r"phi[-_ ]?4"),
    ("phi3", r"phi[-_ ]?3"),
    ("mistral", r"mistral|mixtral|ministral|pixtral|codestral|devstral|magistral|voxtral"),
    ("cohere", r"command[-_ ]?r|command[-_ ]?a|c4ai|\baya|cohere"),
    ("glm", r"glm"),
    ("yi", r"(?:^|[-/_ ])yi[-_ ]"),
    ("lfm2", r"lfm[-_ ]?2"),
    ("granite", r"granite"),
    ("exaone", r"exaone"),
    ("falcon", r"falcon"),
    ("internlm", r"internlm|internvl"),
    ("minicpm", r"minicpm"),
    ("openchat", r"openchat|starling"),
    ("zephyr", r"zephyr"),
    ("vicuna", r"vicuna"),
    ("alpaca", r"alpaca"),
    ("chatml", r"^(?:[a-z0-9]+-)?chat[-_]?ml$"),
    ("olmo", r"olmo|tulu"),
    ("kimi", r"kimi|moonshot"),
    ("ling", r"inclusionai|(?:^|[-/])(?:ling|ring)-"),
    ("step", r"stepfun|step-audio|(?:^|[-/])step3"),
    ("apriel", r"apriel"),
    ("seed", r"seed-oss|seed-coder|bytedance-seed"),
    ("longcat", r"longcat"),
    ("laguna", r"laguna"),
    ("reka", r"reka"),
    ("gigachat", r"gigachat"),
    ("youtu", r"youtu"),
    ("metharme", r"metharme|pygmalion"),
    ("rwkv", r"rwkv"),
    ("minimax", r"minimax"),
    ("hunyuan", r"hunyuan|tencent[-/]hy"),
    ("ernie", r"ernie"),
    ("apertus", r"apertus"),
    ("jamba", r"jamba"),
    ("solar", r"solar"),
    ("orion", r"orion"),
    ("baichuan", r"baichuan"),
]

# (family, all of these substrings) on the template text, tried in order when no name matched.
TEXT_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("gpt-oss", ("<|start|>", "<|channel|>")),
    ("llama4", ("<|header_start|>",)),
    ("llama3", ("<|start_header_id|>",)),
    ("deepseek", ("<｜begin▁of▁sentence｜>",)),
    ("deepseek", ("<｜User｜>",)),
    ("gemma4", ("<|turn>",)),
    ("gemma3", ("<start_of_turn>", "<start_of_image>")),
    ("gemma", ("<start_of_turn>",)),
    ("cohere", ("<|START_OF_TURN_TOKEN|>",)),
    ("glm", ("[gMASK]",)),
    ("phi4", ("<|im_sep|>",)),
    ("phi3", ("<|user|>", "<|end|>")),
    ("exaone", ("[|endofturn|]",)),
    ("openchat", ("GPT4 Correct",)),
    ("granite", ("<|start_of_role|>",)),
    ("kimi", ("<|im_user|>",)),
    ("step", ("<|BOT|>", "<|EOT|>")),
    ("lfm2", ("<|startoftext|>", "<|im_start|>", "<|tool_list_start|>")),
    ("llama2", ("<<SYS>>",)),
    ("mistral", ("[INST]",)),
    # ChatML templates that carry a Qwen release's own defaults, before bare ChatML.
    ("qwen2.5", ("<|im_start|>", "You are Qwen, created by Alibaba Cloud")),
    ("qwen3", ("<|im_start|>", "<think>", "<tool_call>")),
    ("qwen2.5", ("<|im_start|>", "<tool_call>")),
    ("chatml", ("<|im_start|>",)),
    ("zephyr", ("<|user|>", "<|assistant|>")),
    ("alpaca", ("### Instruction",)),
    ("alpaca", ("### Response",)),
    ("vicuna", ("USER:", "ASSISTANT:")),
]

_COMPILED_NAME_RULES = [(family, re.compile(pattern)) for family, pattern in NAME_RULES]


def family_from_name(name: str) -> Optional[str]:
    lowered = (name or "").lower()
    for family, pattern in _COMPILED_NAME_RULES:
        if pattern.search(lowered):
            return family
    return None


def family_from_text(text: str) -> Optional[str]:
    for family, markers in TEXT_RULES:
        if all(marker in text for marker in markers):
            return family
    return None


def detect_family(text: str, name: str = "", aliases: Iterable[str] = ()) -> str:
    """Family key for a template: its own name, else the most common family among the repos shipping it,
    else its special tokens; "unknown" when nothing matches."""
    found = family_from_name(name)
    if found:
        return found
    alias_families = Counter(f for f in (family_from_name(a) for a in aliases or ()) if f)
    if alias_families:
        # Ties go to the earlier rule, so the order of NAME_RULES decides, not the order of the aliases.
        rank = {family: i for i, (family, _) in enumerate(NAME_RULES)}
        return min(alias_families, key=lambda f: (-alias_families[f], rank[f]))
    return family_from_text(text) or UNKNOWN


def family_votes(names: Iterable[str]) -> Counter:
    """How many of `names` (model repos, origin names, tokenizer labels) name each family."""
    return Counter(f for f in (family_from_name(n) for n in names) if f)


def _plurality(votes: Counter) -> str:
    # Ties go to the earlier rule, so the order of NAME_RULES decides, not the order of the names.
    rank = {family: i for i, (family, _) in enumerate(NAME_RULES)}
    return min(votes, key=lambda f: (-votes[f], rank[f]))


def strict_majority(votes: Counter) -> Optional[str]:
    """The family more than half of the votes name, if any."""
    if not votes:
        return None
    top = _plurality(votes)
    return top if votes[top] * 2 > sum(votes.values()) else None


def shared_across_lines(votes: Counter) -> Optional[str]:
    """Why a template is shared across model lines (three or more families vote, none has a majority), else
    None. Template equality then says nothing about a model's tokens: each line that ships it has its own.
    Two names that disagree (a fine-tune named after its base and its own line) do not make it shared."""
    if len(votes) < 3 or strict_majority(votes):
        return None
    shown = ", ".join(f"{family} {count}" for family, count in votes.most_common(4))
    return f"template shared across model lines without a majority ({shown})"


def majority_family(text: str, name: str, names: Iterable[str], votes: Optional[Counter] = None,
                    fallback_names: Optional[Iterable[str]] = None) -> str:
    """The family a strict majority of `names` (plus extra `votes`) names, else `detect_family` on the
    template's own name and `fallback_names` (default: `names`)."""
    names = list(names)
    tally = family_votes(names) + (votes or Counter())
    return strict_majority(tally) or detect_family(text, name, names if fallback_names is None else fallback_names)


# --- variants ------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\w+|[^\w\s]")
_TRIM_MARK = re.compile(r"(\{[%{#])[-+]|[-+]([%}#]\})")
SHINGLE = 5
WITHIN_FAMILY_THRESHOLD = 0.75
ACROSS_FAMILY_THRESHOLD = 0.9


def normalise(text: str) -> list[str]:
    """Tokens of a template with whitespace and Jinja trim markers (`{%-`, `-}}`) dropped: edits that
    only re-indent or re-trim a template do not make it a different template for grouping."""
    return _TOKEN.findall(_TRIM_MARK.sub(r"\1\2", text))


def shingles(text: str, size: int = SHINGLE) -> frozenset:
    tokens = normalise(text)
    if len(tokens) < size:
        return frozenset(["\x1f".join(tokens)])
    return frozenset("\x1f".join(tokens[i:i + size]) for i in range(len(tokens) - size + 1))


def similarity(a_text: str, b_text: str) -> float:
    """Jaccard similarity of the two templates' token shingles, in [0, 1]."""
    return jaccard(shingles(a_text), shingles(b_text))


def jaccard(a: frozenset, b: frozenset) -> float:
    """Jaccard similarity of two shingle sets (similarity() of the texts they came from)."""
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def _entry_fields(entry) -> tuple[str, str, str]:
    """(id, family, text) from a manifest TemplateEntry, a manifest dict (+ "text" or a readable "path"),
    or an (id, family, text) tuple."""
    if isinstance(entry, tuple):
        template_id, family, text = entry
        return template_id, family, text
    if isinstance(entry, dict):
        text = entry.get("text")
        if text is None:
            text = Path(entry["path"]).read_bytes().decode("utf-8")
        return entry["id"], entry.get("family") or UNKNOWN, text
    return entry.id, entry.family or UNKNOWN, entry.source()


class _DisjointSets:
    def __init__(self, items):
        self.parent = {item: item for item in items}

    def find(self, item):
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def similar_pairs(entries, within: float = WITHIN_FAMILY_THRESHOLD, across: float = ACROSS_FAMILY_THRESHOLD):
    """Yield (id_a, id_b, similarity) for templates that are variants: similarity >= `within` for two of
    the same family, >= `across` otherwise. Pairs whose shingle counts alone rule the threshold out are
    skipped (Jaccard <= smaller/larger), which keeps the all-pairs scan fast."""
    rows = []
    for entry in entries:
        template_id, family, text = _entry_fields(entry)
        rows.append((template_id, family, shingles(text)))
    return _pairs_by_shingles(rows, within, across)


def _pairs_by_shingles(rows, within: float, across: float):
    rows = sorted(rows, key=lambda row: (len(row[2]), row[0]))
    lowest = min(within, across)
    for i, (id_a, family_a, set_a) in enumerate(rows):
        for id_b, family_b, set_b in rows[i + 1:]:
            if len(set_a) < lowest * len(set_b):
                break  # sorted by size: every later row is larger still
            needed = within if family_a == family_b else across
            if len(set_a) < needed * len(set_b):
                continue
            score = jaccard(set_a, set_b)
            if score >= needed:
                yield id_a, id_b, score


def group_variants(entries, within: float = WITHIN_FAMILY_THRESHOLD, across: float = ACROSS_FAMILY_THRESHOLD,
                   include_singletons: bool = False) -> dict[str, list[str]]:
    """Groups of templates that are variants of one another (connected by `similar_pairs`).

    Key: "<family>/<id>": the most common family in the group and, of that family, the member most similar
    to all the others (ties: the smallest id); members sorted. Groups of one are left out unless include_singletons."""
    fields = [_entry_fields(e) for e in entries]
    family_of = {template_id: family for template_id, family, _ in fields}
    if len(family_of) != len(fields):
        duplicates = [i for i, n in Counter(f[0] for f in fields).items() if n > 1]
        raise ValueError(f"group_variants: duplicate template ids {duplicates[:5]}")
    sets = _DisjointSets(family_of)
    shingle_sets = {template_id: shingles(text) for template_id, _, text in fields}
    rows = [(template_id, family, shingle_sets[template_id]) for template_id, family, _ in fields]
    for id_a, id_b, _score in _pairs_by_shingles(rows, within, across):
        sets.union(id_a, id_b)
    members: dict[str, list[str]] = {}
    for template_id in family_of:
        members.setdefault(sets.find(template_id), []).append(template_id)
    groups: dict[str, list[str]] = {}
    for ids in members.values():
        if len(ids) < 2 and not include_singletons:
            continue
        ids.sort()
        counts = Counter(family_of[i] for i in ids)
        family = min(counts, key=lambda f: (-counts[f], f))
        # Name the group after its medoid among the dominant family: the copy closest to all the others.
        candidates = [i for i in ids if family_of[i] == family]
        representative = min(candidates, key=lambda c: (
            -sum(jaccard(shingle_sets[c], shingle_sets[o]) for o in ids if o != c), c))
        groups[f"{family}/{representative}"] = ids
    return dict(sorted(groups.items()))


# --- diff ----------------------------------------------------------------------------------------------------

_LONG_LINE = 200
_TAG_START = re.compile(r"(?=\{[%{#])")


def _display_lines(text: str) -> tuple[list[str], bool]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n\\ No newline at end of file\n"
    if not any(len(line) > _LONG_LINE for line in lines):
        return lines, False
    # One-line templates diff as one changed line: split them before each Jinja tag instead, and show the
    # template's own newlines as ↵ (and CR as ␍) so the split is not mistaken for them, nor for a
    # Jinja string's \n escape.
    return _tag_pieces(text), True


def _tag_pieces(text: str) -> list[str]:
    return [p.replace("\r", "␍").replace("\n", "↵") + "\n" for p in _TAG_START.split(text) if p]


def diff_templates(a_text: str, b_text: str, a_label: str = "a", b_label: str = "b", context: int = 3) -> str:
    """Unified diff of two templates ("" when identical). Templates with very long lines are compared
    tag by tag (each piece starts at `{%`, `{{` or `{#`; a newline in the template shows as ↵)."""
    if a_text == b_text:
        return ""
    a_lines, a_split = _display_lines(a_text)
    b_lines, b_split = _display_lines(b_text)
    if a_split != b_split:  # compare like with like
        a_lines, b_lines = _tag_pieces(a_text), _tag_pieces(b_text)
        a_split = b_split = True
    header = "# split at Jinja tags; ↵ marks a newline in the template\n" if a_split else ""
    return header + "".join(difflib.unified_diff(a_lines, b_lines, fromfile=a_label, tofile=b_label, n=context))
