"""Token parity: the tokens llama-server feeds its model against what transformers' apply_chat_template(tokenize=
True) feeds it, with the model's real add-bos/add-eos flags (real llama-server, real transformers)."""
from __future__ import annotations

import pytest

from conformance.judge.tokens import TokenStatus, compare, model_tokens, verdict_for
from runners.base import FeedRequest, Rendered, RenderRequest, Token
from runners.hf import reference_feed, token_tokenizer
from runners.llamacpp import LlamaCppBuiltinRunner, LlamaCppRunner, build_llama_server
from runners.vocab import template_markers

GIGACHAT = "ai-sage/GigaChat-20B-A3B-instruct"
# GigaChat's template reads its separators from additional_special_tokens, as its tokenizer config defines them.
GIGACHAT_KWARGS = {"additional_special_tokens": ["<|role_sep|>", "<|message_sep|>", "[", "]"]}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def servers():
    build_llama_server()
    with LlamaCppRunner(workers=1) as jinja, LlamaCppBuiltinRunner(workers=1) as builtin:
        yield jinja, builtin


def _tokens(*items) -> tuple:
    """Tokens from ("S", text) special and plain text items."""
    return tuple(Token(i, (item[1] if isinstance(item, tuple) else item).encode(), isinstance(item, tuple))
                 for i, item in enumerate(items))


def test_statuses_from_two_sequences():
    bos, eos = ("S", "<s>"), ("S", "</s>")
    reference = _tokens(bos, "[INST] hi [/INST]")
    assert compare(reference, _tokens(bos, "[INST] ", "hi [/INST]"), "<s>", "</s>")["status"] == "token-match"
    doubled = compare(reference, _tokens(bos, bos, "[INST] hi [/INST]"), "<s>", "</s>")
    assert doubled["status"] == "duplicated-bos" and doubled["engine"]["leading_bos"] == 2
    assert compare(_tokens("x"), _tokens(bos, "x"), "<s>", None)["status"] == "added-bos"
    assert compare(reference, _tokens("[INST] hi [/INST]"), "<s>", "</s>")["status"] == "missing-bos"
    assert compare(_tokens("x", eos), _tokens("x", eos, eos), "<s>", "</s>")["status"] == "duplicated-eos"
    assert compare(_tokens("x"), _tokens("x", eos), "<s>", "</s>")["status"] == "added-eos"
    split = compare(_tokens(("S", "<|a|>"), "b"), _tokens("<|a|>b"), None, None)
    assert split["status"] == "token-difference" and split["first_difference"] == 0
    assert split["reference_runs"] == ["special <|a|>", "b"] and split["engine_runs"] == ["<|a|>b"]


def test_the_reference_sequence_is_what_apply_chat_template_tokenize_feeds(hf_renderer):
    from conformance.corpus.manifest import load_corpus

    corpus = load_corpus()
    for template_id in ("codellama-codellama-7b-instruct-hf", "axolotl-gemma", "qwen-qwen2.5-7b-instruct"):
        entry = corpus.get(template_id)
        markers = template_markers(entry.source(), entry.bos_token, entry.eos_token)
        tok = token_tokenizer(entry.bos_token, entry.eos_token, markers, bool(entry.add_bos_token), entry.add_eos_token)
        messages = CHAT[1:] if template_id == "axolotl-gemma" else CHAT  # Gemma refuses a system message
        ids = tok.apply_chat_template(messages, chat_template=entry.source(), add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        rendered = hf_renderer.render(RenderRequest.make(entry.source(), messages, bos_token=entry.bos_token,
                                                         eos_token=entry.eos_token, add_generation_prompt=True))
        fed = reference_feed(rendered.text, entry.bos_token, entry.eos_token, markers, bool(entry.add_bos_token),
                             entry.add_eos_token)
        assert [t.id for t in fed] == list(ids), template_id
        if entry.add_bos_token:  # the model's flag adds a BOS only outside apply_chat_template
            assert tok(rendered.text)["input_ids"][:2] == [fed[0].id] * 2


def test_bos_printed_by_the_template_and_added_by_the_gguf_is_doubled_without_jinja(servers, llama_cpp_cases,
                                                                                     hf_renderer):
    jinja, builtin = servers
    (case,) = [c for c in llama_cpp_cases if c["name"] == GIGACHAT]
    request = RenderRequest.make(case["template_str"], CHAT, bos_token="<s>", eos_token="</s>",
                                 add_generation_prompt=True, kwargs=GIGACHAT_KWARGS)
    reference = hf_renderer.render(request)
    assert isinstance(reference, Rendered)
    assert reference.text.startswith("<s>Be brief.")  # the template prints the BOS itself
    markers = ("<|role_sep|>", "<|message_sep|>")
    expected = reference_feed(reference.text, "<s>", "</s>", markers, True, False)

    def verdict(runner, add_bos):
        (fed,) = runner.feeds_model_many([FeedRequest(request, add_bos, False, markers)])
        return compare(expected, fed.tokens, "<s>", "</s>"), fed

    # Without --jinja, llama.cpp detects GigaChat and writes its literal "<s>"; the GGUF says add_bos_token, so
    # the tokenizer adds another: two BOS reach the model, where transformers feeds one.
    doubled, fed = verdict(builtin, True)
    assert doubled["status"] == str(TokenStatus.DUPLICATED_BOS), doubled
    assert [t.piece for t in fed.tokens[:3]] == [b"<s>", b"<s>", b"B"]
    # The same prompt on a GGUF that does not add a BOS: one, as with transformers.
    clean, _ = verdict(builtin, False)
    assert clean["bos"] == "match" and clean["status"] == str(TokenStatus.MATCH), clean
    # With Jinja, llama.cpp strips the BOS text the template printed and lets the tokenizer add it back.
    stripped, fed = verdict(jinja, True)
    assert stripped["status"] == str(TokenStatus.MATCH), stripped
    assert not fed.prompt.startswith("<s>")


def test_pipeline_gives_every_cell_a_token_verdict_and_the_report_shows_them(servers):
    from conformance.checkrun import check_cells
    from conformance.judge.pipeline import Selection
    from conformance.report import build_report, check_report
    from conformance.report.render import markdown

    jinja, _ = servers
    selection = Selection.load(templates=["codellama-codellama-7b-instruct-hf", "qwen-qwen2.5-7b-instruct",
                                          "microsoft-dialogpt-medium"],
                               cases=["chat-single-user", "chat-multi-turn", "system-only"])
    results = check_cells(jinja, selection.cells())
    verdicts = {r.key: r.tokens for r in results.results}
    byte_status = {r.key: r.status for r in results.results}
    # codellama: the model adds a BOS and its template prints one per user turn: llama.cpp strips the printed one
    # and adds its own, so the sequences agree; a conversation that is only a system message renders nothing,
    # and there llama.cpp still adds its BOS.
    assert verdicts[("codellama-codellama-7b-instruct-hf", "chat-multi-turn")]["status"] == "token-match"
    assert verdicts[("codellama-codellama-7b-instruct-hf", "system-only")]["status"] == "added-bos"
    assert byte_status[("codellama-codellama-7b-instruct-hf", "system-only")] == "match"  # bytes are not tokens
    # qwen: no BOS and add_bos_token false from evidence, add_eos_token unknown: the start is judged, not the rest
    qwen = verdicts[("qwen-qwen2.5-7b-instruct", "chat-single-user")]
    assert qwen["status"] == "unknown" and qwen["bos"] == "match" and qwen["unknown"] == ["add_eos_token"]
    # dialogpt: no evidence for its add_bos_token: no verdict at all, and said so
    dialogpt = verdicts[("microsoft-dialogpt-medium", "chat-single-user")]
    assert dialogpt["status"] == "unknown" and dialogpt["bos"] is None and "add_bos_token" in dialogpt["note"]

    report = build_report([results], selection.describe(), selection.metadata())
    check_report(report)
    tokens = report["runners"]["llamacpp"]["tokens"]
    assert tokens["bos"]["added-bos"] == ["codellama-codellama-7b-instruct-hf"]
    assert tokens["template_counts"]["bos_judged"] == 2 and tokens["template_counts"]["bos_unknown"] == 1
    assert tokens["flags"]["codellama-codellama-7b-instruct-hf"] == {"add_bos_token": True, "add_eos_token": False}
    # shards hold disjoint templates: their merge is the whole
    from conformance.judge.pipeline import RunnerResults
    from conformance.report import merge_reports

    shards = [build_report([RunnerResults(results.info, [r for r in results.results if keep(r.template_id)],
                                          results.expectations)], selection.describe(), selection.metadata())
              for keep in (lambda t: t.startswith("codellama"), lambda t: not t.startswith("codellama"))]
    merged = merge_reports(shards)
    check_report(merged)
    assert merged["runners"]["llamacpp"]["tokens"] == tokens
    assert merged["runners"]["llamacpp"]["basic"] == report["runners"]["llamacpp"]["basic"]
    text = markdown(report)
    assert "### Token parity" in text
    assert "| llamacpp | 3 | 2 | 0 | 1 | 0 | 1 |" in text
    assert "- **llamacpp** added-bos: `codellama-codellama-7b-instruct-hf`" in text


def test_unknown_flags_give_an_unknown_verdict():
    from types import SimpleNamespace

    entry = SimpleNamespace(tokens_evidence={"bos_token": {"status": "evidence"}, "add_bos_token": {"status": "unknown"}},
                            bos_token="<s>", eos_token="</s>", add_bos_token=None, add_eos_token=None,
                            source=lambda: "{{ bos_token }}")
    facts, unknown = model_tokens(entry)
    assert facts is None and unknown == ["add_bos_token", "eos_token", "add_eos_token"]
    verdict = verdict_for(entry, facts, unknown, None, None)
    assert verdict["status"] == "unknown" and "add_bos_token" in verdict["note"]


def test_identify_probe_says_whether_the_file_doubles_the_bos(servers, tmp_path):
    import gguf
    import numpy as np

    from conformance.analysis.identify import identify_gguf, probe_bos
    from conformance.corpus.manifest import load_corpus
    from runners.gguf_header import read_header

    entry = load_corpus().get("bytedance-seed-oss")
    path = tmp_path / "seed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(["<seed:bos>", "<seed:eos>", "x"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(True)
    writer.add_chat_template(entry.source())
    writer.add_tensor("weights", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (finding,) = identify_gguf(path, load_corpus())
    assert finding.builtin["builtin_format"] == "seed_oss"
    assert finding.tokens["flags"]["add_bos_token"] is True
    (text,) = read_header(path).chat_templates().values()
    answers = probe_bos(finding, text)
    # Seed-OSS's built-in format writes "<seed:bos>" itself; the file says add_bos_token: two BOS reach the model.
    assert answers["llamacpp-builtin"]["bos"] == "duplicated-bos"
    assert answers["llamacpp-builtin"]["leading_bos"] == {"reference": 1, "engine": 2}
    assert answers["llamacpp"]["bos"] == "match"
