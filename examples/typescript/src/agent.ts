// An agent that asks Assent for approval before it deletes a file, speaking
// the wire contract (CloudEvents on NATS JetStream, docs/protocol.md):
//
//   node dist/agent.js /tmp/reports/q3.csv
//
// It publishes a `requested` event for the tool call delete_file {"path"},
// reads the broker's `decided` event, checks that the decision belongs to its
// request, and deletes a file only when the outcome is "approved", and then
// the file named by the decision's args: an approver may have edited them.
// Ctrl-C withdraws the request. Exit status: 0 approved and done, 1 error
// (nothing ran), 2 bad usage, 3 denied, 4 expired, 5 cancelled.

import { createHash, randomBytes } from "node:crypto";
import { readFile, unlink } from "node:fs/promises";
import { resolve } from "node:path";
import { parseArgs } from "node:util";

import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";
import {
  connect,
  credsAuthenticator,
  headers,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
} from "@nats-io/transport-node";

import { accountKey, signedByTrusted } from "./signature.js";

const EXIT = { approved: 0, error: 1, usage: 2, denied: 3, expired: 4, cancelled: 5 } as const;
const STREAM = "ASSENT"; // the broker's stream: every assent.> subject
const LOOK_EVERY_MS = 2_000; // how often a waiting agent reads the stored decision
const TOKEN = /^[A-Za-z0-9_-]{1,128}$/; // agent names and request ids are subject tokens

async function main(): Promise<number> {
  // 1. Where the broker is and what to ask, from flags or the environment.
  const { values: flags, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      "nats-url": { type: "string", default: process.env.NATS_URL ?? "nats://127.0.0.1:4222" },
      creds: { type: "string", default: process.env.NATS_CREDS ?? "" }, // broker creds agent NAME
      agent: { type: "string", default: process.env.ASSENT_AGENT ?? "file-manager" },
      user: { type: "string", default: process.env.ASSENT_USER ?? "" },
      id: { type: "string" }, // reuse an id to retry the same request
      timeout: { type: "string", default: "120" }, // seconds
      "trust-decision-key": { type: "string", multiple: true, default: [] },
    },
  });
  const timeout = Number(flags.timeout);
  const id = flags.id ?? uuidv7();
  const trusted = new Set(
    [...flags["trust-decision-key"], ...(process.env.ASSENT_TRUST_DECISION_KEY ?? "").split(",")]
      .flatMap((k) => k.split(","))
      .map((k) => k.trim())
      .filter((k) => k !== ""),
  );
  if (positionals.length !== 1 || !TOKEN.test(flags.agent) || !TOKEN.test(id) || !(timeout > 0)) {
    console.error(
      "usage: node dist/agent.js [--nats-url URL] [--creds FILE] [--agent NAME] [--user NAME] [--id ID]\n" +
        "                          [--timeout SECONDS] [--trust-decision-key A...] FILE",
    );
    return EXIT.usage;
  }
  for (const key of trusted) {
    try {
      accountKey(key);
    } catch (err) {
      console.error(`--trust-decision-key ${key}: not an nkeys account public key (A...): ${(err as Error).message}`);
      return EXIT.usage;
    }
  }

  // 2. The request: the requested event's data. Its digest is what the
  // broker's decision must name (docs/protocol.md, "The request digest").
  const data: Requested = {
    agent: flags.agent,
    tool: "delete_file",
    args: { path: resolve(positionals[0]) },
    hint: `Delete ${resolve(positionals[0])}?`,
    timeout: `${timeout}s`,
  };
  if (flags.user !== "") data.user = flags.user;
  const digest = requestDigest(data);

  // 3. Connect, and get ready for Ctrl-C: once the request is published, a
  // Ctrl-C publishes a cancel for it; a second one leaves at once.
  const nc = await connect({
    servers: flags["nats-url"],
    name: `assent-example-${flags.agent}`,
    authenticator: flags.creds === "" ? undefined : credsAuthenticator(await readFile(flags.creds)),
  });
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc, { checkAPI: false }); // for direct gets
  let interrupted = false;
  let published = false;
  const cancel = () =>
    publishCancel(js, flags.agent, id).catch((err) => console.error(`could not cancel ${id}: ${err}`));
  process.on("SIGINT", () => {
    if (interrupted) process.exit(130);
    interrupted = true;
    console.log(`interrupted: cancelling request ${id} (Ctrl-C again to quit at once)`);
    if (published) void cancel();
  });

  // Listen for the decision and a rejection before publishing, so that
  // neither can slip between the publish and the subscription. The decision
  // is read where the server republishes it once stored, never on
  // assent.decision.<id> itself: a plain subscriber there also gets
  // publishes the stream refused.
  const answers = listen(nc, [`assent-decided.${id}`, `assent.rejection.${id}`]);
  try {
    if (interrupted) return EXIT.cancelled; // Ctrl-C before anything was asked
    // 4. Publish the request on assent.request.<agent> through JetStream,
    // with the event id as Nats-Msg-Id: publishing the same id again is a
    // retry of the same request, never a second one.
    const event = cloudEvent(id, "dev.assent.approval.requested", `agent/${flags.agent}`, data);
    console.log(
      `asking for approval of delete_file ${JSON.stringify(data.args)} as request ${id} (agent ${flags.agent}, ${flags["nats-url"]})`,
    );
    let ack;
    try {
      ack = await js.publish(`assent.request.${flags.agent}`, JSON.stringify(event), {
        msgID: id,
        headers: ceHeaders(),
      });
    } catch (err) {
      console.error(
        `could not publish request ${id} (is the broker running?): ${err}; rerun with --id ${id} to retry it`,
      );
      return EXIT.error;
    }
    published = true;
    if (ack.duplicate) console.log(`the stream already holds request ${id}: this is a retry of it`);
    if (interrupted) await cancel(); // Ctrl-C came while publishing
    console.log(`waiting up to ${timeout}s for a decision (Ctrl-C cancels the request)`);

    // 5. Wait for the decision: the first decided event stored on
    // assent.decision.<id> (with trusted keys, the first a trusted key
    // signed). It is stored already when this is a retry of a decided
    // request.
    const decision = await waitForDecision(jsm, answers, id, digest, trusted, (timeout + 30) * 1000);
    if (decision === undefined) {
      console.error(`no decision for request ${id} within ${timeout + 30}s; nothing was deleted`);
      return EXIT.error;
    }

    // 6. Check the decision belongs to this request before trusting it.
    check(decision, id, digest);

    // 7. Act on it: delete only when approved, and then the decided args.
    const who = (decision.decided_by ?? []).map((d) => d.principal).join(", ");
    const by = who === "" ? "" : ` by ${who}`;
    if (interrupted) {
      console.error(`request ${id} ${decision.outcome}${by} after the interrupt; nothing was deleted`);
      return decision.outcome === "cancelled" ? EXIT.cancelled : EXIT.error;
    }
    if (decision.outcome !== "approved") {
      console.error(
        `request ${id} ${decision.outcome}${by}: ${decision.reason || "no reason given"}; nothing was deleted`,
      );
      return Object.hasOwn(EXIT, decision.outcome) ? EXIT[decision.outcome] : EXIT.error;
    }
    const path = decision.args?.path;
    if (typeof path !== "string") throw new Error(`the approved args have no path: ${canonical(decision.args)}`);
    if (decision.edited) console.log(`the approver edited the arguments to ${canonical(decision.args)}`);
    console.log(`approved${by}: deleting ${path}`);
    await unlink(path);
    console.log(`deleted ${path}`);
    return EXIT.approved;
  } catch (err) {
    console.error(`request ${id}: ${err instanceof Error ? err.message : err}; nothing was deleted`);
    return EXIT.error;
  } finally {
    answers.close();
    await nc.close();
  }
}

// The data of the events this agent reads and writes (docs/protocol.md).
type Requested = {
  agent: string;
  tool: string;
  args: Record<string, unknown>;
  hint: string;
  timeout: string;
  user?: string;
};
type Decided = {
  request_id: string;
  outcome: "approved" | "denied" | "expired" | "cancelled";
  reason?: string;
  args?: Record<string, Json>;
  edited?: boolean;
  args_digest?: string;
  request_digest?: string;
  decided_by?: { principal: string }[];
};

// waitForDecision returns the request's decision: the first decided event
// stored on assent.decision.<id>. The server republishes each message it
// stores there on assent-decided.<id>, and one whose Nats-Last-Sequence is 0
// is the first. A republish can be lost (in a reconnect, or around a change
// of the stream's leader), so it also reads the stored decision with direct
// gets: at once, every LOOK_EVERY_MS while it waits, and once more at the
// end. A rejection of this very request (its id belongs to another one) is
// an error; it returns undefined if no decision came within ms.
async function waitForDecision(
  jsm: JetStreamManager,
  answers: Answers,
  id: string,
  digest: string,
  trusted: Set<string>,
  ms: number,
): Promise<Decided | undefined> {
  const deadline = Date.now() + ms;
  const skipped = new Set<number>(); // stream sequences already said to be skipped
  let failed = ""; // the last error of a look, said once
  const look = async () => {
    try {
      const event = await storedDecision(jsm, id, trusted, skipped);
      failed = "";
      return event;
    } catch (err) {
      if (String(err) !== failed) console.log(`could not read the stored decision: ${err}; trying again`);
      failed = String(err);
      return undefined;
    }
  };
  let nextLook = 0;
  for (;;) {
    const now = Date.now();
    if (now >= nextLook || now >= deadline) {
      const event = await look();
      if (event !== undefined) return event.data as unknown as Decided;
      if (now >= deadline) return undefined;
      nextLook = Date.now() + LOOK_EVERY_MS;
    }
    const m = await answers.next(Math.max(0, Math.min(nextLook, deadline) - Date.now()));
    if (m === undefined) continue;
    if (m.subject.startsWith("assent.rejection.")) {
      const data = readEvent(m.data)?.data as Record<string, Json> | undefined;
      if (data?.request_digest === digest)
        throw new Error(`id ${id} is already used by a different request: ${data.reason}`);
      continue;
    }
    const event = republishedDecision(m, trusted, skipped);
    if (event !== undefined) return event.data as unknown as Decided;
  }
}

// republishedDecision returns the event of a message on assent-decided.<id>
// if it is the decision: the first message stored on its subject
// (Nats-Last-Sequence 0), a decided event, and with trusted keys one a
// trusted key signed. With trusted keys its place does not matter: a
// forgery stored first puts the broker's signed decision second, and only
// a broker signs.
function republishedDecision(m: Msg, trusted: Set<string>, skipped: Set<number>) {
  const seq = Number(m.headers?.get("Nats-Sequence") || NaN); // get says "" for a missing header
  if (trusted.size === 0 && m.headers?.get("Nats-Last-Sequence") !== "0") {
    skip(skipped, seq, m.subject, "it is not the first stored on its subject");
    return undefined;
  }
  return decidedEvent(seq, m.subject, m.data, trusted, skipped);
}

// storedDecision reads the messages stored on assent.decision.<id> in order
// with JetStream direct gets, starting with the first (seq 1,
// next_by_subj; never last_by_subj, which returns whatever was stored
// last), and returns the first decided event (with trusted keys, the first
// one a trusted key signed), if any.
async function storedDecision(jsm: JetStreamManager, id: string, trusted: Set<string>, skipped: Set<number>) {
  for (let seq = 1; ; ) {
    const m = await jsm.direct.getMessage(STREAM, { seq, next_by_subj: `assent.decision.${id}` });
    if (m === null) return undefined;
    const event = decidedEvent(m.seq, m.subject, m.data, trusted, skipped);
    if (event !== undefined) return event;
    seq = m.seq + 1;
  }
}

// decidedEvent returns the message's event if it is a decided event (and,
// with trusted keys, one of them signed it); else it says so, once for the
// message stored as seq, and returns undefined.
function decidedEvent(
  seq: number,
  subject: string,
  body: Uint8Array,
  trusted: Set<string>,
  skipped: Set<number>,
): Record<string, Json> | undefined {
  const event = readEvent(body);
  if (event?.type !== "dev.assent.approval.decided" || typeof event.data !== "object" || event.data === null) {
    skip(skipped, seq, subject, "it is not a decided event");
  } else if (trusted.size > 0 && !signedByTrusted(event, trusted)) {
    skip(skipped, seq, subject, "no trusted key signed it");
  } else {
    return event;
  }
  return undefined;
}

// skip says why the message stored as seq is not the decision, the first
// time it is seen (seq is NaN for a message that names none).
function skip(skipped: Set<number>, seq: number, subject: string, why: string): void {
  if (Number.isNaN(seq)) {
    console.log(`skipping a message on ${subject}: ${why}`);
    return;
  }
  if (skipped.has(seq)) return;
  skipped.add(seq);
  console.log(`skipping a message on ${subject} (stream sequence ${seq}): ${why}`);
}

// readEvent parses a structured-mode CloudEvent (the whole event is the
// body), or returns undefined.
function readEvent(body: Uint8Array): Record<string, Json> | undefined {
  try {
    const event = parseExact(new TextDecoder("utf-8", { fatal: true }).decode(body));
    return typeof event === "object" && event !== null && !Array.isArray(event) && !(event instanceof JsonNumber)
      ? event
      : undefined;
  } catch {
    return undefined;
  }
}

// Answers are the messages on some subjects, in the order they came.
type Answers = { next(ms: number): Promise<Msg | undefined>; close(): void };

function listen(nc: NatsConnection, subjects: string[]): Answers {
  const queue: Msg[] = [];
  let wake = () => {};
  const subs = subjects.map((subject) =>
    nc.subscribe(subject, {
      callback: (err, m) => {
        if (err === null) queue.push(m);
        else console.log(`the subscription to ${subject} failed: ${err.message}`);
        wake();
      },
    }),
  );
  return {
    // next returns the next message, or undefined if none came within ms.
    async next(ms) {
      if (queue.length === 0) {
        let timer: NodeJS.Timeout | undefined;
        await new Promise<void>((done) => {
          wake = done;
          timer = setTimeout(done, ms);
        });
        clearTimeout(timer);
      }
      return queue.shift();
    },
    close: () => subs.forEach((sub) => sub.unsubscribe()),
  };
}

// check refuses a decision that is not about this request: another request
// id, args that do not hash to args_digest, or a request digest other than
// this request's (its id was used by a different request). An approval must
// name its request digest.
function check(d: Decided, id: string, digest: string): void {
  if (d.request_id !== id) throw new Error(`the decision names request ${d.request_id}`);
  if (argsDigest(d.args) !== d.args_digest)
    throw new Error(`the decided args do not match args_digest ${d.args_digest}`);
  const theirs = d.request_digest ?? "";
  if (theirs !== digest && (theirs !== "" || d.outcome === "approved")) {
    throw new Error(
      `the decision is for request digest ${theirs}, this request is ${digest}: the id was used by a different request`,
    );
  }
}

// publishCancel withdraws the request: a cancel event on the agent's own
// cancel subject, assent.cancel.<agent>.<id>.
async function publishCancel(js: JetStreamClient, agent: string, id: string): Promise<void> {
  const event = cloudEvent(uuidv7(), "dev.assent.approval.cancel", `agent/${agent}`, {
    reason: "the agent was interrupted (Ctrl-C)",
  });
  await js.publish(`assent.cancel.${agent}.${id}`, JSON.stringify(event), { msgID: event.id, headers: ceHeaders() });
  console.log(`published a cancel for request ${id}`);
}

// cloudEvent is a CloudEvents 1.0 event in structured mode: the whole event,
// data inlined, is the message body.
function cloudEvent(id: string, type: string, source: string, data: object) {
  return {
    specversion: "1.0",
    id,
    type,
    source,
    datacontenttype: "application/json",
    time: new Date().toISOString(),
    data,
  };
}

function ceHeaders(): MsgHdrs {
  const h = headers();
  h.set("Content-Type", "application/cloudevents+json");
  return h;
}

// ---- Digests (docs/protocol.md, "The args digest", "The request digest") ----

// argsDigest is "sha256:" and the hex SHA-256 of the canonical form of args
// ({} when absent or null).
function argsDigest(args: unknown): string {
  if (args !== undefined && args !== null && (typeof args !== "object" || Array.isArray(args))) {
    throw new Error("the decided args are not an object");
  }
  return sha256(canonical(args ?? {}));
}

// requestDigest is the digest of the request's canonical form: agent, args,
// call_id, labels, response_schema, session, tool and user, each left out
// when empty but args. This agent sends no call_id, labels or schema.
function requestDigest(r: Requested): string {
  const form: Record<string, unknown> = { agent: r.agent, args: r.args, tool: r.tool };
  if (r.user) form.user = r.user;
  return sha256(canonical(form));
}

function sha256(text: string): string {
  return "sha256:" + createHash("sha256").update(text, "utf8").digest("hex");
}

// canonical writes a JSON value in the canonical form: object keys sorted by
// their UTF-8 bytes at every depth, no white space, numbers exactly as they
// were written, strings escaped as below.
function canonical(v: unknown): string {
  if (v instanceof JsonNumber) return v.text;
  if (v === null || typeof v === "boolean") return String(v);
  if (typeof v === "number" && Number.isFinite(v)) return JSON.stringify(v);
  if (typeof v === "string") return quote(v);
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (typeof v === "object") {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    return `{${keys.map((k) => `${quote(k)}:${canonical(o[k])}`).join(",")}}`;
  }
  throw new Error(`${String(v)} has no canonical JSON form`);
}

// quote escapes " and \, writes \n \r \t \b \f as such, other control
// characters as \u00xx, U+2028 and U+2029 as \u2028 and \u2029, and every
// other character as itself (raw UTF-8, no HTML escaping).
const SHORT_ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
  "\b": "\\b",
  "\f": "\\f",
  "\u2028": "\\u2028",
  "\u2029": "\\u2029",
};
function quote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const code = ch.codePointAt(0)!;
    if (Object.hasOwn(SHORT_ESCAPES, ch)) out += SHORT_ESCAPES[ch];
    else if (code < 0x20) out += "\\u" + code.toString(16).padStart(4, "0");
    else if (code >= 0xd800 && code <= 0xdfff) throw new Error("a lone surrogate has no canonical form");
    else out += ch;
  }
  return out + '"';
}

// ---- An exact JSON parser ----

// JSON.parse turns 1.50 into 1.5 and 12345678901234567890 into
// 12345678901234567000, which would change the args digest, and keeps lone
// surrogate escapes, which the protocol refuses. parseExact is JSON.parse
// with numbers kept as written (JsonNumber) and lone surrogates refused.
// As in Go, the last of duplicate keys wins.
class JsonNumber {
  constructor(readonly text: string) {}
}
type Json = null | boolean | string | JsonNumber | Json[] | { [key: string]: Json };

const STRING_ESCAPES: Record<string, string> = {
  '"': '"',
  "\\": "\\",
  "/": "/",
  b: "\b",
  f: "\f",
  n: "\n",
  r: "\r",
  t: "\t",
};
function parseExact(text: string): Json {
  let i = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at offset ${i}`);
  };
  const space = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const hex4 = (): number => {
    const h = text.slice(i, i + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) fail("bad \\u escape");
    i += 4;
    return parseInt(h, 16);
  };
  const string = (): string => {
    let out = "";
    for (i++; ; ) {
      const c = text[i++];
      if (c === undefined) fail("unterminated string");
      if (c === '"') return out;
      if (c < " ") fail("control character in a string");
      if (c !== "\\") {
        out += c;
        continue;
      }
      const e = text[i++];
      if (Object.hasOwn(STRING_ESCAPES, e)) {
        out += STRING_ESCAPES[e];
        continue;
      }
      if (e !== "u") fail("bad escape");
      const unit = hex4();
      if (unit >= 0xdc00 && unit <= 0xdfff) fail("lone surrogate escape");
      if (unit >= 0xd800 && unit <= 0xdbff) {
        if (text.slice(i, i + 2) !== "\\u") fail("lone surrogate escape");
        i += 2;
        const low = hex4();
        if (low < 0xdc00 || low > 0xdfff) fail("lone surrogate escape");
        out += String.fromCharCode(unit, low);
        continue;
      }
      out += String.fromCharCode(unit);
    }
  };
  const value = (): Json => {
    space();
    const c = text[i];
    if (c === "{" || c === "[") {
      const close = c === "{" ? "}" : "]";
      const obj: { [key: string]: Json } = Object.create(null);
      const arr: Json[] = [];
      i++;
      space();
      if (text[i] === close) {
        i++;
        return c === "{" ? obj : arr;
      }
      for (;;) {
        if (c === "{") {
          space();
          if (text[i] !== '"') fail("expected a key");
          const key = string();
          space();
          if (text[i++] !== ":") fail("expected ':'");
          obj[key] = value();
        } else {
          arr.push(value());
        }
        space();
        const sep = text[i++];
        if (sep === close) return c === "{" ? obj : arr;
        if (sep !== ",") fail(`expected ',' or '${close}'`);
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [
      ["true", true],
      ["false", false],
      ["null", null],
    ] as const) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    const number = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
    number.lastIndex = i;
    const m = number.exec(text) ?? fail("unexpected character");
    i += m[0].length;
    return new JsonNumber(m[0]);
  };
  const v = value();
  space();
  if (i !== text.length) fail("more after the value");
  return v;
}

// uuidv7 makes a request id: 48 bits of Unix milliseconds, the version and
// variant, and random bits (RFC 9562), so ids sort by time.
function uuidv7(): string {
  const b = randomBytes(16);
  b.writeUIntBE(Date.now(), 0, 6);
  b[6] = 0x70 | (b[6] & 0x0f);
  b[8] = 0x80 | (b[8] & 0x3f);
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

main().then(
  (code) => (process.exitCode = code),
  (err) => {
    console.error(`error: ${err instanceof Error ? err.message : err}`);
    process.exitCode = EXIT.error;
  },
);
