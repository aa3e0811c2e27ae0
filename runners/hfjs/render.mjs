// The rendering half of the chatgold harness for @huggingface/jinja (harness.mjs speaks the protocol around it;
// benchmarks/hfjs_native.mjs times it in-process). Renders as transformers.js's apply_chat_template does:
// new Template(chat_template).render({messages, add_generation_prompt, tools, documents, ...special tokens that
// are set, ...kwargs}). The library's own strftime_now reads `new Date()` with local-time getters, so the clock is
// frozen by replacing Date and the process runs with TZ=UTC.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL, fileURLToPath } from "node:url";

process.env.TZ = "UTC";

// The runner installs the pinned package into a cache dir (npm ci) and names it here; a local
// node_modules beside this file works too.
const here = fileURLToPath(new URL(".", import.meta.url));
const modulesDir = process.env.CHATGOLD_HFJS_NODE_MODULES || join(here, "node_modules");
const packageDir = join(modulesDir, "@huggingface", "jinja");
export const packageJson = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8"));
const entry = packageJson.exports?.["."]?.import ?? packageJson.module ?? packageJson.main;
const { Template, Environment } = await import(pathToFileURL(join(packageDir, entry)).href);

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

// The library's own raise_exception is `(args) => { throw new Error(args); }`, installed by setupGlobals
// through Environment.set (a template variable cannot replace it: "Variable already declared"). This one,
// installed in its place, throws exactly the same error, marked, so the harness can report the refusal as
// the template's own.
class TemplateRaise extends Error {}
function raiseException(args) {
  const error = new Error(args);
  Object.setPrototypeOf(error, TemplateRaise.prototype);
  throw error;
}
const librarySet = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  return librarySet.call(this, name, name === "raise_exception" && typeof value === "function" ? raiseException : value);
};

// Protocol version 1 refusals carry no kind.
function refusal(seq, kind, err, version) {
  const message = err instanceof Error ? `${err instanceof TemplateRaise ? "Error" : err.name}: ${err.message}` : String(err);
  return version >= 2 ? { seq, raised: { message, kind } } : { seq, raised: { message } };
}

// One render response (runners/protocol/PROTOCOL.md) for one conversation.
export function render(seq, template, bosToken, eosToken, conversation, version = 2) {
  if (conversation.continue_final_message) {
    return { seq, skipped: { reason: "transformers.js apply_chat_template has no continue_final_message" } };
  }
  const ms = RealDate.parse(conversation.now);
  if (Number.isNaN(ms)) return { seq, errored: { message: `cannot parse now ${JSON.stringify(conversation.now)}` } };
  let compiledTemplate;
  try {
    compiledTemplate = compile(template);
  } catch (err) {
    return refusal(seq, "compile", err, version);
  }
  const special = {};
  if (bosToken) special.bos_token = bosToken;
  if (eosToken) special.eos_token = eosToken;
  frozenMs = ms;
  try {
    const text = compiledTemplate.render({
      messages: conversation.messages,
      add_generation_prompt: conversation.add_generation_prompt,
      tools: conversation.tools,
      documents: conversation.documents,
      ...special,
      ...(conversation.kwargs || {}),
    });
    return { seq, text };
  } catch (err) {
    return refusal(seq, err instanceof TemplateRaise ? "raise" : "render", err, version);
  } finally {
    frozenMs = null;
  }
}
