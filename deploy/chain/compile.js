// Compile AvccRegistry.sol with solcjs (the pinned npm `solc`) into AvccRegistry.json.
//   node deploy/chain/compile.js          write the artefact
//   node deploy/chain/compile.js --print  print it instead (the staleness test compares)
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const source = fs.readFileSync(path.join(__dirname, "AvccRegistry.sol"), "utf8");
const input = {
  language: "Solidity",
  sources: { "AvccRegistry.sol": { content: source } },
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "paris",
    metadata: { bytecodeHash: "none" },
    outputSelection: { "*": { AvccRegistry: ["abi", "evm.bytecode.object"] } },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === "error");
if (errors.length) {
  for (const e of errors) console.error(e.formattedMessage);
  process.exit(1);
}
const contract = output.contracts["AvccRegistry.sol"].AvccRegistry;
const artefact = {
  contractName: "AvccRegistry",
  compiler: "solc " + solc.version(),
  abi: contract.abi,
  bytecode: "0x" + contract.evm.bytecode.object,
};
const text = JSON.stringify(artefact, null, 2) + "\n";
if (process.argv.includes("--print")) {
  process.stdout.write(text);
} else {
  fs.writeFileSync(path.join(__dirname, "AvccRegistry.json"), text);
}
