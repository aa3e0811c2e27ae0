// chatgold harness for @huggingface/jinja, the Jinja engine of transformers.js.
// Speaks the harness protocol (runners/protocol/PROTOCOL.md): one JSON message per line on stdin/stdout.
// The rendering itself is render.mjs.
import { createInterface } from "node:readline";
import { packageJson, render } from "./render.mjs";

function send(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

let version = 1;

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
    if (message.version !== 1 && message.version !== 2) {
      send({ error: `unsupported protocol version ${JSON.stringify(message.version)}` });
      process.exit(1);
    }
    version = message.version;
    const info = { name: "hfjs", version: packageJson.version, language: "javascript",
                   homepage: "https://github.com/huggingface/huggingface.js/tree/main/packages/jinja" };
    if (version === 2) Object.assign(info, { protocol: 2, build: `@huggingface/jinja@${packageJson.version} node ${process.version}` });
    send(info);
  } else if (message.cmd === "render") {
    send(render(message.seq, message.template, message.bos_token, message.eos_token, message, version));
  } else if (message.cmd === "batch" && version === 2) {
    message.cases.forEach((conversation, index) => {
      send(render(message.seq + index, message.template, message.bos_token, message.eos_token, conversation, version));
    });
  } else if (message.cmd === "stop") {
    process.exit(0);
  } else {
    process.stderr.write(`hfjs harness: unknown cmd ${JSON.stringify(message.cmd)}\n`);
  }
});
lines.on("close", () => process.exit(0));
