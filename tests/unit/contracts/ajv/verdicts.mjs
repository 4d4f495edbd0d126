// ajv's verdict on every case of the schema-agreement corpus, against the published JSON Schemas.
// Usage: node verdicts.mjs SCHEMA_DIR CORPUS_DIR
// Prints one JSON object: {"validator": "ajv <version>", "verdicts": {"<topic>#<index>": bool}}.
// An event is valid when the envelope schema accepts it and, if its payload is an object, the
// topic's payload schema accepts the payload: the same composition the Python side checks.
import { readFile, readdir } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const [schemaDir, corpusDir] = process.argv.slice(2);
if (!schemaDir || !corpusDir) {
  console.error("usage: node verdicts.mjs SCHEMA_DIR CORPUS_DIR");
  process.exit(2);
}
const { version } = createRequire(import.meta.url)("ajv/package.json");
// Defaults of ajv 8 (strict mode on, patterns as Unicode regular expressions), formats asserted,
// and the generator's own annotation keyword declared instead of relaxing strict mode.
const ajv = new Ajv2020({ allErrors: false });
addFormats(ajv);
ajv.addKeyword("x-avcc-topic");

const readJson = async (path) => JSON.parse(await readFile(path, "utf8"));
const envelope = ajv.compile(await readJson(join(schemaDir, "envelope.json")));
const verdicts = {};
for (const name of (await readdir(corpusDir)).filter((n) => n.endsWith(".json")).sort()) {
  const { topic, cases } = await readJson(join(corpusDir, name));
  const payload = ajv.compile(await readJson(join(schemaDir, `${topic}.json`)));
  cases.forEach((item, index) => {
    const event = item.event;
    let valid = envelope(event);
    const body = event !== null && typeof event === "object" ? event.payload : undefined;
    if (valid && body !== null && typeof body === "object" && !Array.isArray(body)) {
      valid = payload(body);
    }
    verdicts[`${topic}#${index}`] = valid;
  });
}
console.log(JSON.stringify({ validator: `ajv ${version}`, verdicts }));
