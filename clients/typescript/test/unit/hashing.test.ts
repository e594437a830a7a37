/**
 * Every outcome rule of spec §2.3 and §5, each against the canonical text written out by hand
 * (its SHA-256 computed here, not by the code under test).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { hashOutcome, isKnownPoll, isSendCall, unknownToolName, LOOP_VETO_RESULT } from "../../src/hashing.js";
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
  assert.deepEqual(hashOutcome("read", {}, { result: LOOP_VETO_RESULT }), {
    resultHash: null,
    unknownToolName: null,
    loopVeto: true,
    isError: false,
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
