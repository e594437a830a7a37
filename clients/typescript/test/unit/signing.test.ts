/**
 * Signed events (src/signing.ts): the HMAC against RFC 4231's vectors and the README's worked
 * example, the headers byte for byte with schemas.signing's for random keys and record values
 * (the events this client publishes among them), key files read as the workers read them, the
 * secret kept out of every printed form, and the client refusing runs its keys cannot sign.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inspect } from "node:util";
import fc from "fast-check";
import { LoopwatchClient } from "../../src/client.js";
import { completedEvent, encodeEvent } from "../../src/events.js";
import { KEY_ID_HEADER, SIGNATURE_HEADER, SigningKey, SigningKeyError, loadKeys, parseKeys } from "../../src/signing.js";
import { outcomeCase, SEND_TOOLS } from "../support/arbitraries.js";
import { askPython } from "../support/python.js";

const SEED = Number(process.env.LOOPWATCH_FC_SEED ?? 20261201);

test("the signature is RFC 4231's HMAC-SHA-256 (§4.7, §4.8: a key longer than the block)", () => {
  const key = new SigningKey("rfc", "a", Buffer.alloc(131, 0xaa));
  const cases = [
    ["Test Using Larger Than Block-Size Key - Hash Key First", "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"],
    [
      "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
      "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
    ],
  ] as const;
  for (const [data, digest] of cases) {
    assert.equal(key.signature(Buffer.from(data, "ascii")), `sha256=${digest}`);
  }
});

test("the README's worked example (computed there with openssl)", () => {
  const [key] = parseKeys(JSON.stringify({ key_id: "main-2025-01", agent_id: "main", secret: "bG9vcHdhdGNoLWV4YW1wbGUta2V5LTAxMjM0NTY3ODk=" }));
  const value = Buffer.from('{"type":"run.ended","v":1,"event_id":"e1","run_id":"r1","agent_id":"main"}', "utf8");
  assert.deepEqual(key!.headers(value), [
    [KEY_ID_HEADER, "main-2025-01"],
    [SIGNATURE_HEADER, "sha256=e2743f2303bfaf222f1d587d196a8e1e0d7681da90b12d3fb9e8c1343604c4fb"],
  ]);
});

test("about 2,000 random keys and record values: the same headers as schemas.signing", () => {
  const fields = { run_id: "r", session_key: "s", session_id: null, agent_id: "main", tsMs: 1 };
  const events = fc.sample(outcomeCase, { numRuns: 1_000, seed: SEED + 10 }).flatMap(({ tool, args, outcome }) => {
    try {
      return [encodeEvent(completedEvent("e", tool, args, outcome, { ...fields, toolCallId: "c", providerSendTools: new Set(SEND_TOOLS) }))];
    } catch {
      return []; // an outcome that cannot be hashed (hashing tests cover those)
    }
  });
  const bytes = fc.sample(fc.uint8Array({ maxLength: 300 }), { numRuns: 1_000, seed: SEED + 11 }).map((b) => Buffer.from(b));
  const keys = fc.sample(
    fc.tuple(fc.stringMatching(/^[A-Za-z0-9._:-]{1,128}$/), fc.string({ minLength: 1, maxLength: 20 }), fc.uint8Array({ minLength: 32, maxLength: 200 })),
    { numRuns: events.length + bytes.length, seed: SEED + 12 },
  );
  const values = [...events, ...bytes];
  const requests = values.map((value, i) => {
    const [keyId, agentId, secret] = keys[i]!;
    return { op: "sign", key_id: keyId, agent_id: agentId, secret: Buffer.from(secret).toString("hex"), value: value.toString("hex") };
  });
  const python = askPython(requests) as { headers: [string, string][] }[];
  values.forEach((value, i) => {
    const [keyId, agentId, secret] = keys[i]!;
    assert.deepEqual(new SigningKey(keyId, agentId, secret).headers(value), python[i]!.headers, JSON.stringify(requests[i]));
  });
  assert.ok(events.length > 900);
});

test("key files: the workers' format, accepted and refused as schemas.signing does", () => {
  const secret = randomBytes(32).toString("base64");
  const one = { key_id: "main-1", agent_id: "main", secret };
  const texts = [
    JSON.stringify(one),
    JSON.stringify([one, { key_id: "billing-1", agent_id: "billing", secret: randomBytes(48).toString("base64") }]),
    JSON.stringify([]),
    "not json",
    JSON.stringify({ ...one, extra: 1 }),
    JSON.stringify({ key_id: "main-1", agent_id: "main" }),
    JSON.stringify({ ...one, secret: "not base64!" }),
    JSON.stringify({ ...one, secret: "YWJj" }), // 3 bytes
    JSON.stringify({ ...one, secret: secret.slice(0, -1) }), // bad padding
    JSON.stringify({ ...one, key_id: "has space" }),
    JSON.stringify({ ...one, key_id: "k".repeat(129) }),
    JSON.stringify({ ...one, agent_id: "" }),
    JSON.stringify({ ...one, agent_id: 5 }),
    JSON.stringify([one, "x"]),
    JSON.stringify(5),
  ];
  const python = askPython(texts.map((data) => ({ op: "parse_keys", data }))) as ([string, string, string][] | { error: string })[];
  texts.forEach((text, i) => {
    const want = python[i]!;
    if ("error" in want) {
      assert.throws(() => parseKeys(text, "keys.json"), SigningKeyError, text);
      // the same one-line reason, except where the JSON parsers word it their own way
      if (!want.error.includes("not JSON")) {
        assert.throws(() => parseKeys(text, "keys.json"), { message: want.error }, text);
      }
    } else {
      const keys = parseKeys(text, "keys.json").map((k) => [k.keyId, k.agentId, k.signature(Buffer.alloc(0))]);
      const wantKeys = want.map(([id, agent, hex]) => [id, agent, new SigningKey(id, agent, Buffer.from(hex, "hex")).signature(Buffer.alloc(0))]);
      assert.deepEqual(keys, wantKeys, text);
    }
  });
  const dir = mkdtempSync(join(tmpdir(), "lw-keys-"));
  writeFileSync(join(dir, "main.json"), texts[1]!);
  assert.deepEqual(loadKeys(join(dir, "main.json")).map((k) => k.agentId), ["main", "billing"]);
  writeFileSync(join(dir, "empty.json"), "[]");
  assert.throws(() => loadKeys(join(dir, "empty.json")), { message: `${join(dir, "empty.json")}: no signing keys in the file` });
  assert.throws(() => loadKeys(join(dir, "missing.json")), { message: `${join(dir, "missing.json")}: cannot read (ENOENT)` });
});

test("the secret shows in no printed form of a key", () => {
  const secret = Buffer.from("recognisable-secret-for-the-test-0123456789");
  const key = new SigningKey("main-1", "main", secret);
  for (const shown of [inspect(key, { showHidden: true, depth: 5 }), JSON.stringify(key), String(key), `${key.toString()}`]) {
    for (const form of [secret.toString("utf8"), secret.toString("hex"), secret.toString("base64")]) {
      assert.ok(!shown.includes(form), `${shown} shows the secret`);
    }
  }
  assert.throws(() => new SigningKey("main-1", "main", Buffer.alloc(31)), { message: "key main-1: the secret must be at least 32 bytes" });
});

test("a signing client refuses runs of agents it has no key for", async () => {
  const main = new SigningKey("main-1", "main", randomBytes(32));
  const billing = new SigningKey("billing-1", "billing", randomBytes(32));
  const client = new LoopwatchClient({ brokers: ["127.0.0.1:9"], signingKey: main });
  assert.equal(client.run({ runId: "r1", agentId: "main" }).fields.agent_id, "main");
  for (const agentId of ["billing", null]) {
    assert.throws(() => client.run({ runId: "r2", agentId }), {
      name: "LoopwatchInputError",
      message: `this client signs with key main-1 of agent "main"; a run of agent ${JSON.stringify(agentId)} needs that agent's key`,
    });
  }
  // one key per agent: a runner serving several agents holds each one's key
  const both = new LoopwatchClient({ brokers: ["127.0.0.1:9"], signingKey: [main, billing] });
  assert.equal(both.run({ runId: "r3", agentId: "billing" }).fields.agent_id, "billing");
  assert.throws(() => new LoopwatchClient({ brokers: ["127.0.0.1:9"], signingKey: [main, new SigningKey("main-2", "main", randomBytes(32))] }), {
    message: `signingKey: keys main-1 and main-2 are both agent "main"'s; give one key per agent`,
  });
  await Promise.all([client.stop(), both.stop()]);
  // and an unsigned client takes any agent
  const unsigned = new LoopwatchClient({ brokers: ["127.0.0.1:9"] });
  assert.equal(unsigned.run({ runId: "r4", agentId: "anyone" }).fields.agent_id, "anyone");
  await unsigned.stop();
});
