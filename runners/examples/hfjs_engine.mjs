// The engine behind two JavaScript examples (harness.mjs, vectors_hfjs.mjs): @huggingface/jinja, the Jinja
// engine of transformers.js, rendering as transformers.js's apply_chat_template does:
//   new Template(chat_template).render({messages, add_generation_prompt, tools, documents,
//                                       ...special tokens that are set, ...kwargs})
// with no preprocessing of the messages. Node and the library only; no chatgold.
//
// Replace this file with a call into your own engine: everything else in the examples is the protocol.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

// Where @huggingface/jinja is installed: an explicit node_modules directory, $HFJS_NODE_MODULES, or a
// node_modules folder beside this file or in the working directory (`npm install @huggingface/jinja@0.5.11`).
export async function loadEngine(modulesDir) {
  const candidates = [modulesDir, process.env.HFJS_NODE_MODULES, join(fileURLToPath(new URL(".", import.meta.url)), "node_modules"),
                      join(process.cwd(), "node_modules")].filter(Boolean);
  const root = candidates.map((dir) => join(dir, "@huggingface", "jinja")).find((dir) => existsSync(join(dir, "package.json")));
  if (!root) throw new Error(`@huggingface/jinja not found in ${candidates.join(", ")}: npm install @huggingface/jinja`);
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const entry = pkg.exports?.["."]?.import ?? pkg.module ?? pkg.main;
  const library = await import(pathToFileURL(join(root, entry)).href);
  return new Engine(library, pkg.version);
}

// strftime_now reads `new Date()` with local-time getters: the clock is frozen by replacing Date, in UTC.
process.env.TZ = "UTC";
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

// raise_exception is the library's `(m) => { throw new Error(m) }`; an error thrown by the template itself must
// be told apart from the engine's own errors, so the library's global is replaced by one that marks its error.
class TemplateRaise extends Error {}

class Engine {
  constructor(library, version) {
    this.version = version;
    this.Template = library.Template;
    this.compiled = new Map();
    const set = library.Environment.prototype.set;
    library.Environment.prototype.set = function (name, value) {
      if (name === "raise_exception" && typeof value === "function") {
        value = (message) => {
          const error = new Error(message);
          Object.setPrototypeOf(error, TemplateRaise.prototype);
          throw error;
        };
      }
      return set.call(this, name, value);
    };
  }

  compile(source) {
    let template = this.compiled.get(source);
    if (template === undefined) {
      template = new this.Template(source);
      if (this.compiled.size >= 32) this.compiled.delete(this.compiled.keys().next().value);
      this.compiled.set(source, template);
    }
    return template;
  }

  // One outcome: {text} | {refusal: {kind, message}} | {skipped} | {errored}. `variables` (the reference's
  // bindings, SEMANTICS.md) replaces what transformers.js would bind when given.
  render(source, bosToken, eosToken, conversation, variables = null) {
    if (conversation.continue_final_message && variables === null) {
      return { skipped: "transformers.js apply_chat_template has no continue_final_message" };
    }
    const ms = RealDate.parse(conversation.now);
    if (Number.isNaN(ms)) return { errored: `cannot parse now ${JSON.stringify(conversation.now)}` };
    let template;
    try {
      template = this.compile(source);
    } catch (err) {
      return refusal("compile", err);
    }
    if (variables === null) {
      variables = { messages: conversation.messages, add_generation_prompt: conversation.add_generation_prompt,
                    tools: conversation.tools, documents: conversation.documents };
      if (bosToken) variables.bos_token = bosToken; // transformers.js passes a special token only when set
      if (eosToken) variables.eos_token = eosToken;
      Object.assign(variables, conversation.kwargs || {});
    }
    frozenMs = ms;
    try {
      return { text: template.render(variables) };
    } catch (err) {
      return refusal(err instanceof TemplateRaise ? "raise" : "render", err);
    } finally {
      frozenMs = null;
    }
  }
}

function refusal(kind, err) {
  const name = err instanceof TemplateRaise ? "Error" : err?.name ?? "Error";
  return { refusal: { kind, message: err instanceof Error ? `${name}: ${err.message}` : String(err) } };
}
