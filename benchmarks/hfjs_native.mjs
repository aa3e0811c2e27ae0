// @huggingface/jinja's own render time, in-process: the cells of a JSON file rendered by the harness's render
// (runners/examples/hfjs_engine.mjs, the engine of the hfjs runner's harness: compiled templates reused) with no
// protocol around it.
//
//   node benchmarks/hfjs_native.mjs CELLS.json REPEATS [NODE_MODULES_DIR]
//
// CELLS.json: [{template, bos_token, eos_token, conversation: {messages, tools, ...}}, ...]. Prints one JSON
// object: cells, the best pass's wall and CPU milliseconds per cell, and the outcome kinds (so the caller can
// check this rendered what the suite did).
import { readFileSync } from "node:fs";
import { loadEngine } from "../runners/examples/hfjs_engine.mjs";

const cells = JSON.parse(readFileSync(process.argv[2], "utf8"));
const repeats = Number(process.argv[3] || 3);
const engine = await loadEngine(process.argv[4] || null);

function pass() {
  const kinds = { rendered: 0, raised: 0, skipped: 0, errored: 0 };
  for (const cell of cells) {
    const answer = engine.render(cell.template, cell.bos_token, cell.eos_token, cell.conversation);
    kinds["text" in answer ? "rendered" : "refusal" in answer ? "raised" : Object.keys(answer)[0]] += 1;
  }
  return kinds;
}

pass(); // every template compiled, the engine warm
let best = Infinity;
let bestCpu = Infinity;
let kinds;
for (let i = 0; i < repeats; i += 1) {
  const cpu = process.cpuUsage();
  const started = performance.now();
  kinds = pass();
  best = Math.min(best, performance.now() - started);
  const used = process.cpuUsage(cpu);
  bestCpu = Math.min(bestCpu, (used.user + used.system) / 1000);
}
process.stdout.write(JSON.stringify({ cells: cells.length, ms_per_cell: best / cells.length,
                                      cpu_ms_per_cell: bestCpu / cells.length, kinds }) + "\n");
