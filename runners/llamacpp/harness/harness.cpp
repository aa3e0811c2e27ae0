// chatgold's in-process llama.cpp harness: llama-server's /apply-template, one process, a template per request.
//
// Speaks the harness protocol (runners/protocol/PROTOCOL.md, version 2) on stdin/stdout. Each render goes
// through the code llama-server b11434 runs for POST /apply-template, linked from the same source:
//   - the chat parameters are built once per (template, bos, eos) as the server builds them at load
//     (tools/server/server-context.cpp:1582-1623): common_chat_templates_init with the template and the
//     bos/eos texts the server reads from its GGUF's vocabulary (common/chat.cpp:757-854; the tokens there
//     are resolved with common_token_to_piece, :815-831), and, with Jinja, whether the template supports
//     thinking (server-context.cpp:1596-1597);
//   - a request body is the one the llamacpp runner posts (runners/llamacpp/runner.py, request_body), parsed
//     by oaicompat_chat_params_parse (tools/server/server-common.cpp:1265-1460), exactly as the route does
//     (tools/server/server-context.cpp:5416-5426): the OpenAI-compat message parser, message rebuilding,
//     common_chat_templates_apply (common/chat.cpp:1440-1445) and, without Jinja (--builtin), its legacy path
//     to llama_chat_apply_template (common/chat.cpp:1375-1438, src/llama.cpp).
// The server's options are parsed by llama.cpp's own argument parser from the options the llamacpp runner
// starts llama-server with (common_params_parse, common/arg.cpp:860-970), so defaults such as the
// preserve_reasoning kwarg (arg.cpp:965-967) are the server's.
//
// The clock: llama.cpp reads std::chrono::system_clock (common/chat.cpp:1082, chat.h:262). This program
// defines clock_gettime, which libstdc++'s system_clock::now() calls, and answers CLOCK_REALTIME with the
// request's `now` (whole seconds, as libfaketime's frozen stamp gives the server); TZ is UTC.
//
// Refusal kinds follow runners/llamacpp/runner.py (refusal_kind); a template the server would not load is
// answered, for every request, as `compile` with the message prefix LOAD_FAILURE.

#include "arg.h"
#include "build-info.h"
#include "chat.h"
#include "common.h"
#include "log.h"
#include "server-common.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#ifndef CHATGOLD_HARNESS_BUILD
#define CHATGOLD_HARNESS_BUILD "unknown"
#endif

static const char * LOAD_FAILURE = "llama-server would not load the template: ";

// ---- the frozen clock --------------------------------------------------------------------------------------

static std::atomic<bool>   g_clock_frozen{false};
static std::atomic<time_t> g_clock_now{0};

extern "C" int clock_gettime(clockid_t clock, struct timespec * ts) {
    if (g_clock_frozen.load() && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        ts->tv_sec  = g_clock_now.load();
        ts->tv_nsec = 0;
        return 0;
    }
    return (int) syscall(SYS_clock_gettime, clock, ts);
}

// The Jinja runtime reads std::time (common/jinja/runtime.h:73) for strftime_now: glibc's time() does not go
// through clock_gettime, so it is answered here too.
extern "C" time_t time(time_t * out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}

static int digits(const std::string & s, size_t at, size_t n) {
    if (at + n > s.size()) {
        throw std::invalid_argument("now: too short");
    }
    int value = 0;
    for (size_t i = at; i < at + n; i++) {
        if (!isdigit((unsigned char) s[i])) {
            throw std::invalid_argument("now: expected a digit");
        }
        value = value * 10 + (s[i] - '0');
    }
    return value;
}

// ISO-8601 `YYYY-MM-DDTHH:MM:SS[.fff][Z|+HH:MM|-HH:MM]` as UTC seconds (fraction dropped, as libfaketime's
// stamp in runners/llamacpp/clock.py); a naive time is read as UTC.
static time_t parse_now(const std::string & s) {
    struct tm tm = {};
    tm.tm_year = digits(s, 0, 4) - 1900;
    tm.tm_mon  = digits(s, 5, 2) - 1;
    tm.tm_mday = digits(s, 8, 2);
    tm.tm_hour = digits(s, 11, 2);
    tm.tm_min  = digits(s, 14, 2);
    tm.tm_sec  = digits(s, 17, 2);
    size_t at  = 19;
    if (at < s.size() && (s[at] == '.' || s[at] == ',')) {
        at++;
        while (at < s.size() && isdigit((unsigned char) s[at])) {
            at++;
        }
    }
    long offset = 0;
    if (at < s.size() && (s[at] == '+' || s[at] == '-')) {
        int sign = s[at] == '-' ? -1 : 1;
        int hh   = digits(s, at + 1, 2);
        size_t m = at + 3 < s.size() && s[at + 3] == ':' ? at + 4 : at + 3;
        int mm   = m + 2 <= s.size() ? digits(s, m, 2) : 0;
        offset   = sign * (hh * 3600L + mm * 60L);
    }
    return timegm(&tm) - offset;
}

// ---- the server's chat parameters, per template ------------------------------------------------------------

struct loaded_template {
    std::string        key;
    server_chat_params params;
    std::string        load_error;  // non-empty: the server would not start on this template
};

// ---- llama.cpp's log, as the server's log file holds it ------------------------------------------------------
//
// A template the server will not load is reported from its log (the runner reads the reason back from it:
// runners/llamacpp/server.py, failure_reason). llama.cpp's log is copied here to an unlinked file, the same
// lines the server writes (with their level prefix, common_init), so the load's own lines can be handed back.

static int         g_log_fd = -1;
static std::string g_log_path;

static void log_open() {
    char path[] = "/tmp/chatgold-llamacpp-harness-log-XXXXXX";
    const char * dir = getenv("TMPDIR");
    std::string templ = dir && *dir ? std::string(dir) + "/chatgold-llamacpp-harness-log-XXXXXX" : path;
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    g_log_fd = mkstemp(buf.data());
    if (g_log_fd < 0) {
        return;
    }
    unlink(buf.data());  // nothing left behind, whatever ends this process
    g_log_path = "/proc/self/fd/" + std::to_string(g_log_fd);
    common_log_set_file(common_log_main(), g_log_path.c_str());
}

static off_t log_size() {
    struct stat st;
    return g_log_fd >= 0 && fstat(g_log_fd, &st) == 0 ? st.st_size : 0;
}

// Where the next load's lines start; the file is emptied when it has grown large.
static off_t log_mark() {
    if (g_log_fd >= 0 && log_size() > (off_t) (4 << 20)) {
        common_log_set_file(common_log_main(), g_log_path.c_str());  // reopened for writing: truncated
    }
    return log_size();
}

static std::string log_since(off_t mark) {
    common_log_flush(common_log_main());
    std::string text;
    if (g_log_fd < 0) {
        return text;
    }
    off_t end = log_size();
    if (end > mark) {
        text.resize((size_t) (end - mark));
        ssize_t got = pread(g_log_fd, text.data(), text.size(), mark);
        text.resize(got > 0 ? (size_t) got : 0);
    }
    return text;
}

// What the server logs as its load fails: llama.cpp's own lines (above: the log), then the server's (server-context.cpp:1599).
static std::string load_log(off_t mark, const std::exception & e) {
    // SRV_ERR (server-common.h:37) prefixes the function's name, and the message names it again
    LOG_ERR("srv  %12.*s: %s: chat template parsing error: %s\n", 12, "init", "init", e.what());
    std::string text = log_since(mark);
    return text.empty() ? std::string("chat template parsing error: ") + e.what() : text;
}

struct harness {
    common_params                base;  // the server's options, parsed as llama-server parses them
    std::list<loaded_template>   loaded;  // most recently used first
    static constexpr size_t      KEEP = 16;

    loaded_template & load(const std::string & tmpl, const std::optional<std::string> & bos,
                           const std::optional<std::string> & eos) {
        std::string key = tmpl;
        for (const auto * tok : {&bos, &eos}) {
            key.push_back('\0');
            key += tok->has_value() ? "1" + **tok : std::string("0");
        }
        for (auto it = loaded.begin(); it != loaded.end(); ++it) {
            if (it->key == key) {
                loaded.splice(loaded.begin(), loaded, it);
                return loaded.front();
            }
        }
        loaded.emplace_front();
        loaded_template & entry = loaded.front();
        entry.key               = key;
        if (loaded.size() > KEEP) {
            loaded.pop_back();
        }
        // The runner's GGUF (runners/llamacpp/model.py) holds the template as tokenizer.chat_template, the bos
        // and eos as CONTROL tokens, whose piece is their text, and a missing one as an UNUSED token, whose piece
        // is empty (src/llama-vocab.cpp, token_to_piece); add_bos/add_eos are false there, as here without a
        // model. An empty template is read from the file as "", which common_chat_templates_init replaces with
        // ChatML (chat.cpp:780-786), as it does for the override "chatml".
        const std::string src       = tmpl.empty() ? std::string("chatml") : tmpl;
        const std::string token_bos = bos.value_or("");
        const std::string token_eos = eos.value_or("");
        common_chat_templates_ptr tmpls;
        bool enable_thinking = false;
        const off_t mark = log_mark();
        // A failure stops the server's load (server-context.cpp:1598-1603, in init, called from load_model at
        // :1523); what it logged is the reason. common_chat_templates_init logs the original error
        // (chat.cpp:842) before rethrowing a copy sliced to std::exception (:845), so the log, not the
        // exception, has the message the server route reports.
        try {
            tmpls = common_chat_templates_init(nullptr, src, token_bos, token_eos);
        } catch (const std::exception & e) {
            entry.load_error = load_log(mark, e);
            return entry;
        }
        try {
            // server-context.cpp:1590-1592 formats an example only at trace verbosity (above the default)
            if (common_log_get_verbosity_thold() >= LOG_LEVEL_TRACE) {
                common_chat_format_example(tmpls.get(), base.use_jinja, base.default_template_kwargs);
            }
            const bool supports = base.use_jinja && common_chat_templates_support_enable_thinking(tmpls.get());
            enable_thinking     = base.enable_reasoning != 0 && supports;
        } catch (const std::exception & e) {
            entry.load_error = load_log(mark, e);
            return entry;
        }
        entry.params = {
            /* use_jinja             */ base.use_jinja,
            /* prefill_assistant     */ base.prefill_assistant,
            /* reasoning_format      */ base.reasoning_format,
            /* chat_template_kwargs  */ base.default_template_kwargs,
            /* tmpls                 */ std::move(tmpls),
            /* allow_image           */ false,  // no multimodal projector: the runner's GGUF has none
            /* allow_audio           */ false,
            /* allow_video           */ false,
            /* enable_thinking       */ enable_thinking,
            /* reasoning_budget      */ base.sampling.reasoning_budget_tokens,
            /* reasoning_budget_msg  */ base.sampling.reasoning_budget_message,
            /* media_path            */ base.media_path,
            /* force_pure_content    */ base.force_pure_content_parser,
        };
        try {
            // server-context.cpp:1625-1627 reads the caps right after; a failure there stops the load too
            (void) common_chat_templates_get_caps(entry.params.tmpls.get());
        } catch (const std::exception & e) {
            entry.load_error = load_log(mark, e);
        }
        return entry;
    }
};

// ---- protocol ------------------------------------------------------------------------------------------------

static FILE * g_out = nullptr;  // the protocol's stdout; fd 1 is pointed at stderr for everything else

static void send_line(const json & message) {
    std::string line = message.dump_safe();  // as the server's answers (server-common.cpp:1643-1645)
    line.push_back('\n');
    fwrite(line.data(), 1, line.size(), g_out);
    fflush(g_out);
}

static std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char) tolower(c); });
    return s;
}

// runners/llamacpp/runner.py refusal_kind and builtin_runner.py's unsupported messages.
static const char * refusal_kind(const std::string & message, bool at_load, bool builtin) {
    if (builtin) {
        for (const char * text : {"this custom template is not supported, try using --jinja",
                                  "tools param requires --jinja flag", "tool_choice param requires --jinja flag"}) {
            if (message.find(text) != std::string::npos) {
                return "unsupported";
            }
        }
    }
    if (message.find("Jinja Exception: ") != std::string::npos) {
        return "raise";
    }
    const std::string low = lower(message);
    if (at_load || low.find("parser") != std::string::npos || low.find("lexer") != std::string::npos) {
        return "compile";
    }
    return "render";
}

// The body runners/llamacpp/runner.py (request_body) posts for one conversation.
static json request_body(const json & conv) {
    json kwargs = conv.contains("kwargs") && conv.at("kwargs").is_object() ? conv.at("kwargs") : json::object();
    if (conv.contains("documents") && !conv.at("documents").is_null()) {
        if (kwargs.contains("documents")) {
            throw std::domain_error("documents and kwargs['documents'] both given");
        }
        kwargs["documents"] = conv.at("documents");
    }
    json body                     = json::object();
    body["messages"]              = conv.at("messages");
    body["add_generation_prompt"] = conv.contains("add_generation_prompt") &&
                                    conv.at("add_generation_prompt").is_boolean() &&
                                    conv.at("add_generation_prompt").get<bool>();
    body["chat_template_kwargs"]  = kwargs;
    if (conv.contains("tools") && !conv.at("tools").is_null()) {
        body["tools"] = conv.at("tools");
    }
    if (conv.contains("continue_final_message") && conv.at("continue_final_message").is_boolean() &&
        conv.at("continue_final_message").get<bool>()) {
        body["continue_final_message"] = true;
    }
    return body;
}

static std::optional<std::string> token_text(const json & message, const char * key) {
    if (!message.contains(key) || message.at(key).is_null()) {
        return std::nullopt;
    }
    std::string text = message.at(key).get<std::string>();
    if (text.empty()) {
        return std::nullopt;  // the runner's GGUF stores "" as a missing token (model_for: `bos_token or None`)
    }
    return text;
}

static json raised(int64_t seq, const std::string & message, const char * kind) {
    return json{{"seq", seq}, {"raised", json{{"message", message}, {"kind", kind}}}};
}

static json render_one(harness & h, int64_t seq, const std::string & tmpl, const std::optional<std::string> & bos,
                       const std::optional<std::string> & eos, const json & conv) {
    const bool builtin = !h.base.use_jinja;
    try {
        if (conv.contains("now") && conv.at("now").is_string()) {
            g_clock_now.store(parse_now(conv.at("now").get<std::string>()));
            g_clock_frozen.store(true);
        }
        json body;
        try {
            body = request_body(conv);
        } catch (const std::domain_error & e) {
            return json{{"seq", seq}, {"skipped", json{{"reason", e.what()}}}};
        }
        loaded_template & entry = h.load(tmpl, bos, eos);
        if (!entry.load_error.empty()) {
            return raised(seq, LOAD_FAILURE + entry.load_error, refusal_kind(entry.load_error, true, builtin));
        }
        std::vector<raw_buffer> files;
        // tools/server/server-context.cpp:5416-5426, inside the route's exception handler (server.cpp:55-91)
        json data = oaicompat_chat_params_parse(body, entry.params, files);
        return json{{"seq", seq}, {"text", data.at("prompt").get<std::string>()}};
    } catch (const std::exception & e) {
        const std::string message = e.what();
        return raised(seq, message, refusal_kind(message, false, builtin));
    }
}

int main(int argc, char ** argv) {
    // The protocol owns stdout; llama.cpp logs info lines to stdout, so fd 1 becomes stderr.
    int protocol_fd = dup(1);
    dup2(2, 1);
    g_out = fdopen(protocol_fd, "wb");
    setenv("TZ", "UTC", 1);
    tzset();
    std::setlocale(LC_NUMERIC, "C");  // server.cpp:96

    bool builtin = false;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--builtin") == 0) {
            builtin = true;
        } else {
            fprintf(stderr, "usage: %s [--builtin]\n", argv[0]);
            return 2;
        }
    }
    // The options the llamacpp runner gives llama-server that reach the chat layer (runners/llamacpp/server.py,
    // server_argv), through llama.cpp's own parser; model, network and batch options do not reach it.
    std::vector<const char *> server_args = {"llama-server", builtin ? "--no-jinja" : "--jinja",
                                             "--no-prefill-assistant"};
    harness h;
    common_init();  // server.cpp:105
    // Log lines without timestamps: the clock is the requests' frozen one here (the reader of a load's log,
    // server.py's failure_reason, takes lines with and without them alike).
    common_log_set_timestamps(common_log_main(), false);
    log_open();
    if (!common_params_parse((int) server_args.size(), const_cast<char **>(server_args.data()), h.base,
                             LLAMA_EXAMPLE_SERVER)) {
        fprintf(stderr, "llama.cpp did not accept the server options\n");
        return 1;
    }

    std::string line;
    while (std::getline(std::cin, line)) {
        json message = json::parse_no_throw(line);
        if (message.is_discarded() || !message.is_object()) {
            fprintf(stderr, "harness: ignoring a line that is not a JSON object\n");
            continue;
        }
        const std::string cmd = message.value("cmd", "");
        if (cmd == "start") {
            if (!message.contains("version") || !message.at("version").is_number_integer() ||
                message.at("version").get<int64_t>() != 2) {
                send_line(json{{"error", "unsupported protocol version"}});
                return 0;
            }
            send_line(json{{"name", builtin ? "llamacpp-builtin-inproc" : "llamacpp-inproc"},
                           {"version", "b" + std::to_string(llama_build_number())},
                           {"language", "c++"},
                           {"homepage", "https://github.com/ggml-org/llama.cpp"},
                           {"protocol", 2},
                           {"build", std::string(CHATGOLD_HARNESS_BUILD) + (builtin ? "+builtin" : "+jinja")}});
        } else if (cmd == "render" || cmd == "batch") {
            const int64_t seq = message.at("seq").get<int64_t>();
            std::string tmpl;
            std::optional<std::string> bos, eos;
            try {
                tmpl = message.at("template").get<std::string>();
                bos  = token_text(message, "bos_token");
                eos  = token_text(message, "eos_token");
            } catch (const std::exception & e) {
                send_line(json{{"seq", seq}, {"errored", json{{"message", std::string("bad request: ") + e.what()}}}});
                continue;
            }
            if (cmd == "render") {
                send_line(render_one(h, seq, tmpl, bos, eos, message));
            } else {
                const json & cases = message.at("cases");
                for (size_t i = 0; i < cases.size(); i++) {
                    send_line(render_one(h, seq + (int64_t) i, tmpl, bos, eos, cases.at(i)));
                }
            }
        } else if (cmd == "stop") {
            return 0;
        } else {
            fprintf(stderr, "harness: unknown cmd\n");
        }
    }
    return 0;
}
