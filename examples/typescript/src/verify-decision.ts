// Checks the signature of one decided event as the agent does:
//
//   node dist/verify-decision.js --trust-decision-key A... < event.json
//
// The event is a structured-mode CloudEvent, as the stream stores it. Exit
// status: 0 a trusted key signed it (its outcome is printed), 1 none did,
// 2 bad usage. integration/examples_test.go runs it on the worked example of
// docs/protocol.md.

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { accountKey, signedByTrusted } from "./signature.js";

function main(): number {
  const { values } = parseArgs({ options: { "trust-decision-key": { type: "string", multiple: true, default: [] } } });
  const trusted = new Set(values["trust-decision-key"]);
  if (trusted.size === 0) {
    console.error("usage: node dist/verify-decision.js --trust-decision-key A... [--trust-decision-key A...] < event.json");
    return 2;
  }
  for (const key of trusted) {
    try {
      accountKey(key);
    } catch (err) {
      console.error(`--trust-decision-key ${key}: not an nkeys account public key (A...): ${(err as Error).message}`);
      return 2;
    }
  }
  let event: unknown;
  try {
    event = JSON.parse(readFileSync(0, "utf8"));
  } catch (err) {
    console.error(`the event is not JSON: ${(err as Error).message}`);
    return 1;
  }
  if (typeof event !== "object" || event === null || !signedByTrusted(event as Record<string, unknown>, trusted)) {
    console.log("no trusted key signed it");
    return 1;
  }
  const data = (event as { data: { outcome?: unknown } }).data;
  console.log(`a trusted key signed it: ${data.outcome}`);
  return 0;
}

process.exitCode = main();
