// chatgold harness for @huggingface/jinja, the Jinja engine of transformers.js.
// Speaks the harness protocol (runners/protocol/PROTOCOL.md): one JSON message per line on stdin/stdout.
//
// Renders as transformers.js's apply_chat_template does: new Template(chat_template).render({messages,
// add_generation_prompt, tools, documents, ...special tokens that are set, ...kwargs}). The library's own
// strftime_now reads `new Date()` with local-time getters, so the clock is frozen by replacing Date and the
// process runs with TZ=UTC.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL, fileURLToPath } from "node:url";

process.env.TZ = "UTC";

// The runner installs the pinned package into a cache dir (npm ci) and names it here; a local
// node_modules beside this file works too.
const here = fileURLToPath(new URL(".", import.meta.url));
const modulesDir = process.env.CHATGOLD_HFJS_NODE_MODULES || join(here, "node_modules");
const packageDir = join(modulesDir, "@huggingface", "jinja");
const packageJson = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8"));
const entry = packageJson.exports?.["."]?.import ?? packageJson.module ?? packageJson.main;
const { Template } = await import(pathToFileURL(join(packageDir, entry)).href);

const RealDate = globalThis.Date;
let frozenMs = null;
class FrozenDate extends RealDate {
  constructor(...args) {
    if (args.length === 0 && frozenMs !== null) super(frozenMs);
    else super(...args);
  }
  static now() {
    return frozenMs !== null ? frozenMs : RealDate.now();
  }
}
globalThis.Date = FrozenDate;

// transformers.js's SPECIAL_TOKEN_ATTRIBUTES, passed only when set (it tests `if (value)`).
const SPECIAL_TOKENS = ["bos_token", "eos_token"];

const compiled = new Map();
function compile(source) {
  let template = compiled.get(source);
  if (template === undefined) {
    template = new Template(source);
    if (compiled.size >= 32) compiled.delete(compiled.keys().next().value);
    compiled.set(source, template);
  }
  return template;
}

function send(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

function render(message) {
  const seq = message.seq;
  if (message.continue_final_message) {
    return { seq, skipped: { reason: "transformers.js apply_chat_template has no continue_final_message" } };
  }
  const ms = RealDate.parse(message.now);
  if (Number.isNaN(ms)) return { seq, errored: { message: `cannot parse now ${JSON.stringify(message.now)}` } };
  const special = {};
  for (const key of SPECIAL_TOKENS) if (message[key]) special[key] = message[key];
  frozenMs = ms;
  try {
    const text = compile(message.template).render({
      messages: message.messages,
      add_generation_prompt: message.add_generation_prompt,
      tools: message.tools,
      documents: message.documents,
      ...special,
      ...(message.kwargs || {}),
    });
    return { seq, text };
  } catch (err) {
    const text = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    return { seq, raised: { message: text } };
  } finally {
    frozenMs = null;
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (!line.trim()) return;
  let message;
  try {
    message = JSON.parse(line);
  } catch (err) {
    process.stderr.write(`hfjs harness: ignoring a line that is not JSON: ${err.message}\n`);
    return;
  }
  if (message.cmd === "start") {
    if (message.version !== 1) {
      send({ error: `unsupported protocol version ${JSON.stringify(message.version)}` });
      process.exit(1);
    }
    send({ name: "hfjs", version: packageJson.version, language: "javascript",
           homepage: "https://github.com/huggingface/huggingface.js/tree/main/packages/jinja" });
  } else if (message.cmd === "render") {
    send(render(message));
  } else if (message.cmd === "stop") {
    process.exit(0);
  } else {
    process.stderr.write(`hfjs harness: unknown cmd ${JSON.stringify(message.cmd)}\n`);
  }
});
lines.on("close", () => process.exit(0));
