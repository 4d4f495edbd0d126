// Parse an AsyncAPI document with the reference parser (@asyncapi/parser) and print its diagnostics.
// Usage: node deploy/contracts/validate.mjs schemas/asyncapi.yaml
// Exit 0: parsed without errors (warnings are printed); 1: errors; 2: usage.
import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { Parser, DiagnosticSeverity } from "@asyncapi/parser";

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs ASYNCAPI_FILE");
  process.exit(2);
}
const path = resolve(file);
const parser = new Parser();
const { document, diagnostics } = await parser.parse(await readFile(path, "utf8"), { source: path });
const severity = ["error", "warning", "info", "hint"];
let errors = 0;
for (const d of diagnostics) {
  if (d.severity === DiagnosticSeverity.Error) errors += 1;
  console.log(`${severity[d.severity] ?? d.severity} ${d.code} at ${d.path.join(".")}: ${d.message}`);
}
if (errors > 0 || document === undefined) {
  console.log(`invalid: ${errors} error(s)`);
  process.exit(1);
}
console.log(`valid: AsyncAPI ${document.version()}, ${document.channels().length} channels, ` +
  `${document.operations().length} operations, ${document.messages().length} messages`);
