// A chatgold harness in JavaScript, written from runners/protocol/PROTOCOL.md: copy it, put your engine in
// hfjs_engine.mjs's place, and check it with `chatgold harness validate -- node harness.mjs`.
//
//   node harness.mjs [--bindings] [--modules NODE_MODULES_DIR]
//
// The engine here is @huggingface/jinja rendering as transformers.js does. With --bindings the harness asks
// chatgold for the reference's exact template variables (protocol version 2) and renders with those, so what
// is measured is the Jinja engine alone, not transformers.js's (absent) message preprocessing.
import { createInterface } from "node:readline";
import { loadEngine } from "./hfjs_engine.mjs";

const args = process.argv.slice(2);
const wantBindings = args.includes("--bindings");
const modulesAt = args.indexOf("--modules");
const engine = await loadEngine(modulesAt >= 0 ? args[modulesAt + 1] : null);

let version = 1; // settled by start

// Protocol: one JSON object per line, stdout only for responses, flushed line by line (stdout writes of a
// pipe are asynchronous in node but keep their order; nothing else is ever written to stdout).
function send(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

// R22 steps 5-6 of SEMANTICS.md: with bindings, the final message already carries the tag; cut at it.
const TAG = "CONTINUE_FINAL_MESSAGE_TAG ";
const PY_WS = "[\\t\\n\\v\\f\\r\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const PY_SPACE = new RegExp(`${PY_WS}+$`, "u"); // Python's str.isspace() characters, for rstrip()
function finalText(messages) {
  const content = messages[messages.length - 1].content;
  if (!Array.isArray(content)) return content;
  const block = [...content].reverse().find((b) => b && typeof b === "object" && "text" in b);
  return block.text;
}
function pyStrip(text) {
  return text.replace(new RegExp(`^${PY_WS}+`, "u"), "").replace(PY_SPACE, "");
}
function cut(text, final) {
  if (!text.includes(pyStrip(final)) || !text.includes(TAG.trim())) {
    return { refusal: { kind: "render", message: "ValueError: continue_final_message is set but the final message does not appear in the chat after applying the chat template!" } };
  }
  const at = text.lastIndexOf(TAG.trim());
  return { text: text.slice(at, at + TAG.length) === TAG ? text.slice(0, at) : text.slice(0, at).replace(PY_SPACE, "") };
}

function renderOne(template, bosToken, eosToken, conversation) {
  const bindings = conversation.bindings;
  if (bindings === undefined) return engine.render(template, bosToken, eosToken, conversation);
  if (bindings.refused) {
    // The reference refuses this conversation before rendering; after the compile, a compile error wins.
    if (!bindings.refused.before_compile) {
      try {
        engine.compile(template);
      } catch (err) {
        return { refusal: { kind: "compile", message: `${err.name}: ${err.message}` } };
      }
    }
    return { refusal: { kind: bindings.refused.kind, message: bindings.refused.message } };
  }
  const outcome = engine.render(template, bosToken, eosToken, conversation, bindings);
  if (conversation.continue_final_message && outcome.text !== undefined) {
    return cut(outcome.text, finalText(conversation.messages));
  }
  return outcome;
}

function response(seq, outcome) {
  if (outcome.text !== undefined) return { seq, text: outcome.text };
  if (outcome.refusal) {
    const raised = { message: outcome.refusal.message };
    if (version >= 2) raised.kind = outcome.refusal.kind; // version 1 has no kinds
    return { seq, raised };
  }
  if (outcome.skipped !== undefined) return { seq, skipped: { reason: outcome.skipped } };
  return { seq, errored: { message: outcome.errored } };
}

function answer(seq, template, bosToken, eosToken, conversation) {
  let outcome;
  try {
    outcome = renderOne(template, bosToken, eosToken, conversation);
  } catch (err) { // the harness's own bug: errored, never a refusal of the template
    outcome = { errored: `harness failed: ${err?.stack ?? err}` };
  }
  send(response(seq, outcome));
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (!line.trim()) return;
  const message = JSON.parse(line);
  switch (message.cmd) {
    case "start": {
      if (message.version !== 1 && message.version !== 2) {
        send({ error: `unsupported protocol version ${JSON.stringify(message.version)}` });
        process.exit(1);
      }
      version = message.version;
      const info = { name: "hfjs-example", version: engine.version, language: "javascript",
                     homepage: "https://github.com/huggingface/huggingface.js/tree/main/packages/jinja" };
      if (version === 2) {
        info.protocol = 2;
        // Outcomes are a pure function of the engine build, the template and the conversation: say which build.
        info.build = `@huggingface/jinja@${engine.version} node ${process.version}${wantBindings ? " bindings" : ""}`;
        if (wantBindings) info.bindings = true;
      }
      send(info);
      break;
    }
    case "render":
      answer(message.seq, message.template, message.bos_token, message.eos_token, message);
      break;
    case "batch": // version 2: one response per conversation, seq, seq + 1, ...
      message.cases.forEach((conversation, i) => {
        answer(message.seq + i, message.template, message.bos_token, message.eos_token, conversation);
      });
      break;
    case "stop":
      process.exit(0);
      break;
    default:
      process.stderr.write(`harness.mjs: unknown cmd ${JSON.stringify(message.cmd)}\n`);
  }
});
lines.on("close", () => process.exit(0));
