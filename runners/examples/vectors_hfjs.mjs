// Run chatgold test vectors through @huggingface/jinja: a consumer written from docs/vectors.md alone.
//
//   node vectors_hfjs.mjs vectors.jsonl[.gz] [--statuses OUT.jsonl] [--modules NODE_MODULES_DIR] [--show N]
//
// Renders every cell as transformers.js does (hfjs_engine.mjs), judges each outcome as docs/vectors.md says
// ("Judging a cell") and prints the counts. Exit 0 when every judged cell passes, 1 otherwise. Cells the
// engine declines (continue_final_message: transformers.js has none) are skipped: counted, never judged.
import { createReadStream, createWriteStream } from "node:fs";
import { createInterface } from "node:readline";
import { createGunzip } from "node:zlib";
import { loadEngine } from "./hfjs_engine.mjs";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  if (at < 0) return fallback;
  const [value] = args.splice(at, 2).slice(1);
  return value;
};
const statusesPath = option("--statuses", null);
const modulesDir = option("--modules", null);
const show = Number(option("--show", "10"));
if (args.length !== 1) {
  process.stderr.write("usage: node vectors_hfjs.mjs VECTORS.jsonl[.gz] [--statuses OUT] [--modules DIR] [--show N]\n");
  process.exit(2);
}
const engine = await loadEngine(modulesDir);

// Byte-exact comparison of UTF-8 text; a lone surrogate counts as its 3-byte (WTF-8) encoding (docs/vectors.md).
function wtf8(text) {
  const bytes = [];
  for (let i = 0; i < text.length; i++) {
    let code = text.charCodeAt(i);
    if (code >= 0xd800 && code <= 0xdbff && i + 1 < text.length) {
      const low = text.charCodeAt(i + 1);
      if (low >= 0xdc00 && low <= 0xdfff) {
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        i++;
      }
    }
    if (code < 0x80) bytes.push(code);
    else if (code < 0x800) bytes.push(0xc0 | (code >> 6), 0x80 | (code & 63));
    else if (code < 0x10000) bytes.push(0xe0 | (code >> 12), 0x80 | ((code >> 6) & 63), 0x80 | (code & 63));
    else bytes.push(0xf0 | (code >> 18), 0x80 | ((code >> 12) & 63), 0x80 | ((code >> 6) & 63), 0x80 | (code & 63));
  }
  return Buffer.from(bytes);
}

function judge(expected, outcome) {
  if (outcome.skipped !== undefined) return "skipped";
  if (outcome.errored !== undefined) return "errored";
  if (expected.kind === "rendered") {
    if (outcome.refusal) return "engine-raised";
    return wtf8(outcome.text).equals(wtf8(expected.text)) ? "match" : "diverged";
  }
  if (!outcome.refusal) return "engine-rendered";
  const { kind, message } = outcome.refusal;
  if (kind !== expected.refusal.kind || (kind === "raise" && !message.includes(expected.refusal.message))) {
    return "raised-differently";
  }
  return "both-raised";
}

const path = args[0];
let input = createReadStream(path);
if (path.endsWith(".gz")) input = input.pipe(createGunzip());
const lines = createInterface({ input, crlfDelay: Infinity });
const out = statusesPath ? createWriteStream(statusesPath) : null;
const counts = {};
let header = null;
let shown = 0;
for await (const line of lines) {
  if (!line) continue;
  const record = JSON.parse(line);
  if (header === null) {
    if (record.record !== "header" || record.format !== 2) {
      process.stderr.write(`${path}: not a chatgold vectors file of format 2\n`);
      process.exit(2);
    }
    header = record;
    continue;
  }
  const { template, case: conversation, expected } = record;
  const outcome = engine.render(template.source, template.bos_token, template.eos_token, conversation);
  const status = judge(expected, outcome);
  counts[status] = (counts[status] ?? 0) + 1;
  if (out) out.write(JSON.stringify({ template: template.id, case: conversation.id, status }) + "\n");
  if (!["match", "both-raised", "skipped"].includes(status) && shown < show) {
    shown++;
    const got = outcome.text ?? JSON.stringify(outcome.refusal ?? outcome.errored);
    console.log(`${template.id} x ${conversation.id}: ${status}\n  expected: ${JSON.stringify(expected.text.slice(0, 200))}\n  got:      ${JSON.stringify(got.slice(0, 200))}`);
  }
}
if (out) await new Promise((resolve) => out.end(resolve));
const total = Object.values(counts).reduce((a, b) => a + b, 0);
const judged = total - (counts.skipped ?? 0);
const passed = (counts.match ?? 0) + (counts["both-raised"] ?? 0);
const summary = Object.keys(counts).sort().map((k) => `${k}=${counts[k]}`).join(", ");
console.log(`@huggingface/jinja ${engine.version}: ${passed}/${judged} judged cells pass` +
            (judged ? ` (${(100 * passed / judged).toFixed(2)}%)` : "") + `, ${total} cells: ${summary}`);
process.exit(passed === judged ? 0 : 1);
