/**
 * Every outcome rule of spec §2.3 and §5, and profile latest's additions (openclaw-latest.md
 * §4), each against the canonical text written out by hand (its SHA-256 computed here, not by
 * the code under test).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { argsHash as argsHashOf, failureShape, hashOutcome, isKnownPoll, isSendCall, unknownToolName, writeTargetHash } from "../../src/hashing.js";
import { blockedResult } from "../../src/events.js";
import { objectFrom } from "../support/arbitraries.js";

const sha = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");
const NONE = new Set<string>();

function resultHash(tool: string, args: unknown, result: unknown, sendTools = NONE) {
  return hashOutcome(tool, args, { result }, sendTools).resultHash;
}

test("rule 1: thrown errors hash their text; the unknown tool's name is extracted", () => {
  const golden = hashOutcome("exec", {}, { error: new Error("Tool exec not found") });
  assert.deepEqual(golden, {
    resultHash: "error:97dac4bb07ccc8dc5e8636bef0977d8d47b19daded96b97cb9d141a474c77cb9",
    unknownToolName: "exec",
    loopVeto: false,
    isError: true,
    normalizedResultHash: null,
    outcomeKind: null,
    failureIdentityHash: null,
    noProgress: true, // latest: every error made no progress
  });
  const nameOnly = new Error("");
  nameOnly.name = "TimeoutError";
  assert.equal(hashOutcome("x", {}, { error: nameOnly }).resultHash, `error:${sha('"TimeoutError"')}`);
  const empty = new Error("");
  empty.name = "";
  assert.equal(hashOutcome("x", {}, { error: empty }).resultHash, `error:${sha('""')}`);
  assert.equal(hashOutcome("x", {}, { error: "boom" }).resultHash, `error:${sha('"boom"')}`);
  assert.equal(hashOutcome("x", {}, { error: 5 }).resultHash, `error:${sha('"5"')}`);
  assert.equal(hashOutcome("x", {}, { error: -0 }).resultHash, `error:${sha('"0"')}`);
  assert.equal(hashOutcome("x", {}, { error: true }).resultHash, `error:${sha('"true"')}`);
  assert.equal(hashOutcome("x", {}, { error: 10n }).resultHash, `error:${sha('"10"')}`);
  assert.equal(hashOutcome("x", {}, { error: { a: 1 } }).resultHash, `error:${sha('"{\\"a\\":1}"')}`);
  assert.equal(hashOutcome("x", {}, { error: null }).resultHash, `error:${sha('"null"')}`);
  // a thrown undefined is no error at all (upstream tests `error !== undefined`)
  assert.equal(hashOutcome("x", {}, { error: undefined }).resultHash, null);
});

test("unknown-tool names: JavaScript's \\s and trim, ASCII-only case folding", () => {
  assert.equal(unknownToolName("unknown tool: Foo"), "foo");
  assert.equal(unknownToolName('Unknown Tool "Bar.baz"'), "bar.baz");
  assert.equal(unknownToolName("Tool web_search not found"), "web_search");
  assert.equal(unknownToolName("tool 'x-1' is not available"), "x-1");
  assert.equal(unknownToolName("\ufeffunknown tool:\u00a0Qux"), "qux"); // U+FEFF trims, U+00A0 is \s
  assert.equal(unknownToolName("unknown tool:\u0085qux"), null); // U+0085 is not \s in JavaScript
  assert.equal(unknownToolName("unknown tool: ſearch"), null); // no Unicode folding of ſ to s
  assert.equal(unknownToolName("all fine"), null);
  assert.equal(unknownToolName(new Error("unknown tool: X")), "x");
});

test("rule 2: non-object results hash whole; undefined gives no hash", () => {
  assert.equal(resultHash("read", {}, undefined), null);
  assert.equal(resultHash("read", {}, "text"), sha('"text"'));
  assert.equal(resultHash("read", {}, [1, "a"]), sha('[1,"a"]'));
  assert.equal(resultHash("read", {}, null), sha("null"));
  const error = new Error("e");
  error.stack = "s";
  assert.equal(resultHash("read", {}, error), sha('{"message":"e","name":"Error","stack":"s"}')); // not a plain object
});

test("rule 4: the loop's own veto gives no hash; other vetoes hash normally", () => {
  assert.deepEqual(hashOutcome("read", {}, { result: blockedResult("CRITICAL: stop") }), {
    resultHash: null,
    unknownToolName: null,
    loopVeto: true,
    isError: false,
    normalizedResultHash: null,
    outcomeKind: null,
    failureIdentityHash: null,
    noProgress: false,
  });
  const plugin = { content: [{ type: "text", text: "no" }], details: { status: "blocked", deniedReason: "plugin-before-tool-call" } };
  assert.equal(resultHash("read", {}, plugin), sha('{"details":{"deniedReason":"plugin-before-tool-call","status":"blocked"},"text":"no"}'));
});

test("rule 5: exec hashes only its stable fields", () => {
  const running = { content: [{ type: "text", text: "still running (pid 7)" }], details: { status: "running", tail: "...", pid: 7 } };
  assert.equal(resultHash("exec", {}, running), sha('{"status":"running","tail":"..."}'));
  const completed = { details: { status: "completed", exitCode: 0, aggregated: "  out\n", durationMs: 12, cwd: "/" } };
  assert.equal(resultHash("exec", {}, completed), sha('{"exitCode":0,"output":"out","status":"completed","timedOut":false}'));
  const failedEmpty = { content: [{ type: "text", text: " text " }], details: { status: "failed", exitCode: "1", aggregated: " \ufeff", timedOut: true } };
  assert.equal(resultHash("exec", {}, failedEmpty), sha('{"exitCode":null,"output":"text","status":"failed","timedOut":true}'));
  const pending = { details: { status: "approval-pending", command: "ls", reason: 5, approvalId: "a1" } };
  assert.equal(resultHash("exec", {}, pending), sha('{"command":"ls","host":null,"reason":null,"status":"approval-pending","warningText":""}'));
  const other = { details: { status: "queued" } };
  assert.equal(resultHash("exec", {}, other), sha('{"details":{"status":"queued"},"text":""}'));
});

test("rule 6: process poll and log keep the raw status; ?? turns null and undefined into null", () => {
  assert.equal(
    resultHash("process", { action: "poll" }, { details: { exitCode: undefined, aggregated: "x" } }),
    sha('{"action":"poll","aggregated":"x","exitCode":null,"exitSignal":null,"status":undefined,"text":""}'),
  );
  assert.equal(
    resultHash("process", { action: "log" }, { content: [{ type: "log", text: "l1" }], details: { status: null, totalLines: 3, truncated: false } }),
    sha('{"action":"log","exitCode":null,"exitSignal":null,"status":null,"text":"l1","totalChars":null,"totalLines":3,"truncated":false}'),
  );
  assert.equal(isKnownPoll("process", { action: "poll" }), true);
  assert.equal(isKnownPoll("process", { action: "kill" }), false);
  assert.equal(isKnownPoll("command_status", "anything"), true);
});

test("rule 7: sends drop volatile ids at any depth (and ignore the text)", () => {
  const details = objectFrom([
    ["ok", true],
    ["messageId", "m1"],
    ["receipt", { platformMessageId: "p" }],
    ["message", { id: "x9", text: "hi", direction: "out", channel: "c" }],
    ["route", { id: "r1" }],
    ["__proto__", { injected: true }],
  ]);
  const expected = sha('{"message":{"channel":"c","direction":"out","text":"hi"},"ok":true,"route":{"id":"r1"}}');
  assert.equal(resultHash("message", { action: "send" }, { content: [{ type: "text", text: "sent m1" }], details }), expected);
  assert.equal(resultHash("sessions_send", {}, { details }), expected);
  assert.equal(resultHash("telegram", {}, { details }, new Set(["telegram"])), expected);
  assert.equal(isSendCall("message", { action: "read" }, NONE), false);
  assert.equal(isSendCall("telegram", {}, NONE), false);
});

test("rule 8: otherwise details and text, in full", () => {
  const result = { content: [{ type: "text", text: " a " }, { type: "image", text: "b" }, { text: "no type" }, "junk"], details: { durationMs: 5 } };
  assert.equal(resultHash("read", {}, result), sha('{"details":{"durationMs":5},"text":"a \\nb"}'));
  assert.equal(resultHash("read", {}, { details: [1] }), sha('{"details":{},"text":""}'));
});

// -- profile latest (openclaw-latest.md §4), each against canonical text written out by hand ----

const ID_A = "0123456789abcdef";
const ID_B = "fedcba9876543210";
const wrapped = (id: string, body: string) => `<<<EXTERNAL_UNTRUSTED_CONTENT id="${id}">>>${body}<<<END_EXTERNAL_UNTRUSTED_CONTENT id="${id}">>>`;
const ZEROED = wrapped("0000000000000000", "page");

test("latest §4.1: envelope ids are canonicalised in values, keys, error texts and JSON-escaped text", () => {
  const result = { content: [{ type: "text", text: wrapped(ID_A, "page") }], details: {} };
  const outcome = hashOutcome("web_fetch", {}, { result });
  // configurable-final hashes the text as it is; latest with the ids zeroed
  assert.equal(outcome.resultHash, sha(`{"details":{},"text":${JSON.stringify(wrapped(ID_A, "page"))}}`));
  assert.equal(outcome.normalizedResultHash, sha(`{"details":{},"text":${JSON.stringify(ZEROED)}}`));
  // another id: a different configurable-final hash, the same latest hash
  const other = hashOutcome("web_fetch", {}, { result: { ...result, content: [{ type: "text", text: wrapped(ID_B, "page") }] } });
  assert.notEqual(other.resultHash, outcome.resultHash);
  assert.equal(other.normalizedResultHash, outcome.normalizedResultHash);
  // in a key, which then sorts by its canonical form (before "a": "<" < "a")
  const keyed = hashOutcome("read", {}, { result: { details: { a: 1, [wrapped(ID_A, "k")]: 2 } } });
  assert.equal(keyed.normalizedResultHash, sha(`{"details":{${JSON.stringify(wrapped("0000000000000000", "k"))}:2,"a":1},"text":""}`));
  // one level of JSON string encoding: the quotes around the ids are \" (k = 1)
  const escaped = JSON.stringify({ html: wrapped(ID_A, 'say "hi"') });
  assert.equal(
    hashOutcome("read", {}, { result: escaped }).normalizedResultHash,
    sha(JSON.stringify(JSON.stringify({ html: wrapped("0000000000000000", 'say "hi"') }))),
  );
  // an error's text too, with its error: prefix
  const error = hashOutcome("read", {}, { error: new Error(wrapped(ID_A, "page")) });
  assert.equal(error.normalizedResultHash, `error:${sha(JSON.stringify(ZEROED))}`);
  assert.equal(error.noProgress, true);
});

test("latest §4.1: malformed envelopes keep their ids (no normalised hash)", () => {
  const kept = [
    wrapped(ID_A.toUpperCase(), "page"), // uppercase id
    wrapped("abc", "page"), // short id
    wrapped(ID_A, "page").replace(`id="${ID_A}">>>page`, `id="${ID_B}">>>page`), // start and end ids differ
    wrapped(ID_A, "<<<EXTERNAL_UNTRUSTED_CONTENT nested"), // another marker in between
    wrapped(ID_A, "page").replaceAll('"', '\\\\"'), // two backslashes before every quote: k = 2 is no JSON depth
    JSON.stringify(wrapped(ID_A, 'a "b" c')).replace('\\"b', '\\\\\\\\"b'), // an inner quote escaped once too often
    wrapped(ID_A, "page").slice(0, -3), // unterminated
  ];
  for (const text of kept) {
    const outcome = hashOutcome("read", {}, { result: text });
    assert.equal(outcome.resultHash, sha(JSON.stringify(text)), text);
    assert.equal(outcome.normalizedResultHash, null, text);
  }
  // and args are never canonicalised
  assert.equal(argsHashOf("web_fetch", { q: wrapped(ID_A, "x") }), `web_fetch:${sha(`{"q":${JSON.stringify(wrapped(ID_A, "x"))}}`)}`);
});

test("latest §4.2: a terminal exec failure carries an identity with the drift masked", () => {
  const output = (n: number) =>
    `FAILED at 2026-08-1${n}T10:0${n}:13.5+02:00, retry #${n} after ${n}.5 s (pid=${4000 + n}) [${n}0:00:01] took ${n}ms`;
  assert.equal(failureShape(output(1)), "FAILED at #, # after # (#) [#] took #");
  const failed = (n: number) => ({ details: { status: "failed", exitCode: 2, aggregated: output(n), durationMs: n } });
  const first = hashOutcome("exec", {}, { result: failed(1) });
  const second = hashOutcome("exec", {}, { result: failed(2) });
  assert.equal(first.outcomeKind, "terminal-exec-failure");
  assert.equal(first.failureIdentityHash, sha('{"exitCode":2,"output":"FAILED at #, # after # (#) [#] took #","status":"failed","timedOut":false}'));
  assert.equal(second.failureIdentityHash, first.failureIdentityHash); // drifting output, one failure
  assert.notEqual(second.resultHash, first.resultHash); // configurable-final sees progress
  assert.equal(first.normalizedResultHash, null);
  // a bare date, an errno, ſ (U+017F folds to s under /iu) and Kelvin K
  assert.equal(failureShape("on 2026-08-10 errno 13 took 5ſ, 3 \u212Aelvin 12:00:00"), "on 2026-08-10 errno 13 took #, 3 \u212Aelvin #");
  // not terminal failures: exit 0, timed out, non-numeric or non-finite code, empty output, the bare footer
  for (const details of [
    { status: "completed", exitCode: 0, aggregated: "x" },
    { status: "failed", exitCode: 1, aggregated: "x", timedOut: true },
    { status: "failed", exitCode: "1", aggregated: "x" },
    { status: "failed", exitCode: Infinity, aggregated: "x" },
    { status: "failed", exitCode: 1, aggregated: "  " },
    { status: "failed", exitCode: 7, aggregated: "(Command exited with code 7)" },
    { status: "running", exitCode: 1, tail: "x" },
  ]) {
    const outcome = hashOutcome("exec", {}, { result: { details } });
    assert.deepEqual([outcome.outcomeKind, outcome.failureIdentityHash], [null, null], JSON.stringify(details));
  }
  // a negative code counts
  assert.equal(hashOutcome("exec", {}, { result: { details: { status: "failed", exitCode: -1, aggregated: "boom" } } }).outcomeKind, "terminal-exec-failure");
});

test("latest §4.3: writes that changed nothing hash alike and made no progress; targets hash the path verbatim", () => {
  const unchanged = (path: string, text: string) => hashOutcome("write", { path }, { result: { content: [{ type: "text", text }], details: { changed: false, path } } });
  const a = unchanged("a.md", "No changes");
  const b = unchanged("b.md", "nothing to do");
  assert.equal(a.resultHash, sha('{"details":{"changed":false,"path":"a.md"},"text":"No changes"}'));
  assert.equal(a.normalizedResultHash, sha('{"status":"unchanged"}'));
  assert.equal(b.normalizedResultHash, a.normalizedResultHash);
  assert.deepEqual([a.noProgress, a.outcomeKind], [true, null]);
  const changed = hashOutcome("write", { path: "a.md" }, { result: { details: { changed: true } } });
  assert.deepEqual([changed.resultHash, changed.normalizedResultHash, changed.outcomeKind, changed.noProgress],
    [sha('{"details":{"changed":true},"text":""}'), null, "write-mutation", false]);
  // only tool write, only a boolean `changed`
  assert.equal(hashOutcome("edit", {}, { result: { details: { changed: true } } }).outcomeKind, null);
  assert.equal(hashOutcome("write", {}, { result: { details: { changed: "false" } } }).noProgress, false);
  assert.equal(writeTargetHash("write", { path: "./notes.md", content: "x" }), sha('{"path":"./notes.md"}'));
  assert.notEqual(writeTargetHash("write", { path: "notes.md" }), writeTargetHash("write", { path: "./notes.md" }));
  for (const [tool, args] of [["write", { path: "" }], ["write", { path: 5 }], ["write", ["notes.md"]], ["write", null], ["edit", { path: "a" }]] as const) {
    assert.equal(writeTargetHash(tool, args), null, JSON.stringify([tool, args]));
  }
});
