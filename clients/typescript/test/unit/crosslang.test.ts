/**
 * The same event for every call: TypeScript's edge hashing and events against the project's
 * own Python (`streams/edge/events.py` over `streams/edge/hashing.py`), every field of both
 * profiles and the record value byte for byte, on the shared conformance vectors' arguments
 * and outcomes and on 10,000+ random values of each kind with JavaScript's edge cases and
 * profile latest's (envelopes, drifting failures, writes). The worker's own decoder accepts
 * every record. Values cross to Python losslessly (test/support/transport.ts).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import type { ToolOutcome } from "../../src/hashing.js";
import { agentMessageEvent, completedEvent, encodeEvent, eventKey, requestedEvent, stateKey, type EventFields, type ToolCallEvent } from "../../src/events.js";
import { LoopwatchInputError } from "../../src/errors.js";
import { argsCase, outcomeCase, SEND_TOOLS } from "../support/arbitraries.js";
import { conformanceCasesPath } from "../support/paths.js";
import { askPython } from "../support/python.js";
import { decodeValue, encodeValue } from "../support/transport.js";
import { compatibilityPartitioner } from "@platformatic/kafka";

const RANDOM_VALUES = 10_000;
const SEED = Number(process.env.LOOPWATCH_FC_SEED ?? 20261201);

/** The oracle builds every event with these ids (test/oracle.py, `_FIELDS`). */
const ORACLE_FIELDS: EventFields = { run_id: "oracle-run", session_key: "oracle", session_id: null, agent_id: null, tsMs: 0 };

/** An event as both sides give it: its fields, and its record value (the bytes published). */
type Answer = { event: Record<string, unknown>; wire: string } | { failed: "too-deep" };

function answer(build: () => ToolCallEvent): Answer {
  let event: ToolCallEvent;
  try {
    event = build();
  } catch (err) {
    // Both languages refuse values nested past JSON_DEPTH_LIMIT, and overflow their stack on
    // the same cyclic inputs (upstream does too).
    if (err instanceof LoopwatchInputError && /nested too deeply|nested deeper than 128 levels/.test(err.message)) {
      return { failed: "too-deep" };
    }
    throw err;
  }
  const wire = encodeEvent(event).toString("utf8");
  return { event: JSON.parse(wire) as Record<string, unknown>, wire };
}

function tsRequested(tool: string, args: unknown): Answer {
  return answer(() => requestedEvent("oracle", tool, args, { ...ORACLE_FIELDS, toolCallId: null, gate: false }));
}

function tsCompleted(tool: string, args: unknown, outcome: ToolOutcome, sendTools: readonly string[]): Answer {
  return answer(() =>
    completedEvent("oracle", tool, args, outcome, { ...ORACLE_FIELDS, toolCallId: null, providerSendTools: new Set(sendTools) }),
  );
}

function outcomeRequest(tool: string, args: unknown, outcome: ToolOutcome, sendTools: readonly string[]) {
  const request: Record<string, unknown> = { op: "outcome", tool, args: encodeValue(args), send_tools: sendTools };
  if ("error" in outcome) {
    request.error = encodeValue(outcome.error);
  } else if (outcome.result !== undefined) {
    request.result = encodeValue(outcome.result);
  }
  return request;
}

/** Where they differ, with the value in transport form so it can be replayed. */
function assertSame<T>(got: readonly T[], want: readonly unknown[], describe: (i: number) => unknown): void {
  assert.equal(got.length, want.length);
  for (let i = 0; i < got.length; i += 1) {
    assert.deepStrictEqual(got[i], want[i], `case ${i} differs: ${JSON.stringify(describe(i)).slice(0, 2000)}`);
  }
}

/** The worker's decoder accepts every record value this client publishes and re-encodes it to the same bytes. */
function assertWorkerAccepts(answers: readonly Answer[]): void {
  const wires = answers.flatMap((a) => ("wire" in a ? [a.wire] : []));
  const decoded = askPython(wires.map((wire) => ({ op: "decode", wire })));
  assertSame(decoded, wires.map((wire) => ({ wire })), (i) => wires[i]);
}

/** What an outcome exercised, so a test can require that its generator reached every rule. */
function reachedBy(a: Answer): string[] {
  if ("failed" in a) return ["overflow"];
  const e = a.event;
  const out = [e.loop_veto ? "veto" : e.is_error ? (e.unknown_tool_name ? "unknown" : "error") : e.result_hash === null ? "none" : "hash"];
  if (e.normalized_result_hash !== null) out.push(e.no_progress ? "write-unchanged" : "envelope-canonicalised");
  if (e.outcome_kind !== null) out.push(String(e.outcome_kind));
  if (e.target_hash !== null) out.push("target");
  return out;
}

test(`${RANDOM_VALUES} random calls: the same tool_call.requested record in TypeScript and Python (seed ${SEED})`, () => {
  const cases = fc.sample(argsCase, { numRuns: RANDOM_VALUES, seed: SEED });
  const python = askPython(cases.map(({ tool, args }) => ({ op: "args", tool, args: encodeValue(args) })));
  const typescript = cases.map(({ tool, args }) => tsRequested(tool, args));
  assertSame(typescript, python, (i) => ({ tool: cases[i]!.tool, args: encodeValue(cases[i]!.args) }));
  assertWorkerAccepts(typescript);
  assert.ok(typescript.some((a) => "event" in a && a.event.target_hash !== null), "no write target was hashed");
});

test(`${RANDOM_VALUES} random tool outcomes: the same tool_call.completed record in TypeScript and Python (seed ${SEED})`, () => {
  const cases = fc.sample(outcomeCase, { numRuns: RANDOM_VALUES, seed: SEED + 1 });
  const python = askPython(cases.map(({ tool, args, outcome }) => outcomeRequest(tool, args, outcome, SEND_TOOLS)));
  const typescript = cases.map(({ tool, args, outcome }) => tsCompleted(tool, args, outcome, SEND_TOOLS));
  assertSame(typescript, python, (i) => outcomeRequest(cases[i]!.tool, cases[i]!.args, cases[i]!.outcome, SEND_TOOLS));
  assertWorkerAccepts(typescript);
  // The generator must actually reach the rules it is meant to test, profile latest's included.
  const reached = new Set(typescript.flatMap(reachedBy));
  assert.deepEqual([...reached].sort(), [
    "envelope-canonicalised", "error", "hash", "none", "overflow", "target", "terminal-exec-failure", "unknown", "veto",
    "write-mutation", "write-unchanged",
  ]);
});

test("the conformance vectors' arguments and outcomes: the same records in TypeScript and Python", () => {
  const [items] = askPython([{ op: "cases", path: conformanceCasesPath() }]) as [
    { case: string; tool: string; args: unknown; result?: unknown; error?: unknown; outcome?: boolean; send_tools: string[]; python: Answer }[],
  ];
  assert.ok(items.length > 1_000, `only ${items.length} tool calls in the vectors`);
  let outcomes = 0;
  for (const item of items) {
    const args = decodeValue(item.args);
    if ("error" in item || "result" in item || item.outcome) {
      outcomes += 1;
      const outcome: ToolOutcome = "error" in item ? { error: decodeValue(item.error) } : { result: decodeValue(item.result) };
      assert.deepStrictEqual(tsCompleted(item.tool, args, outcome, item.send_tools), item.python, `${item.case}: ${item.tool}`);
    } else {
      assert.deepStrictEqual(tsRequested(item.tool, args), item.python, `${item.case}: ${item.tool}`);
    }
  }
  assert.ok(outcomes > 500, `only ${outcomes} outcomes in the vectors`);
});

test("the state key of a run (its verdicts' Kafka key) and its events' Kafka key are the worker's", () => {
  const fields = fc.sample(
    fc.record({
      run_id: fc.oneof(fc.constant(null), fc.constantFrom("", "  ", "\ufeffr1 ", "run-1", "\u0085x\u0085"), fc.string()),
      session_key: fc.oneof(fc.constant(null), fc.string()),
      session_id: fc.oneof(fc.constant(null), fc.string()),
      agent_id: fc.constant(null),
    }),
    { numRuns: 500, seed: SEED + 2 },
  );
  const python = askPython(fields.map((f) => ({ op: "state_key", fields: f })));
  assertSame(fields.map(stateKey), python, (i) => fields[i]);
  const named = fields.filter((f) => f.run_id || f.session_key || f.session_id);
  const pythonKeys = askPython(named.map((f) => ({ op: "record_key", fields: f })));
  assertSame(named.map(eventKey), pythonKeys, (i) => named[i]);
});

test("a run id lands on the partition the Python client and the worker's own tests give it", () => {
  const keys = fc.sample(fc.string({ minLength: 1, maxLength: 40 }), { numRuns: 500, seed: SEED + 3 });
  for (const partitions of [1, 3, 4, 12]) {
    const python = askPython(keys.map((key) => ({ op: "partition", key, partitions })));
    // what the producer does with the partitioner's answer: modulo the partition count
    const typescript = keys.map((key) => compatibilityPartitioner({ topic: "t" } as never, Buffer.from(key, "utf8")) % partitions);
    assertSame(typescript, python, (i) => keys[i]);
  }
});

test(`${RANDOM_VALUES} random calls with the peer profiles' fields and random messages: the same records in TypeScript and Python (seed ${SEED})`, () => {
  // JSON values only: Gemini's key is JSON.stringify of arguments a model sent as JSON.
  const calls = fc.sample(
    fc.record({
      tool: fc.constantFrom("read_file", "run_shell_command", "é"),
      args: fc.json().map((text) => JSON.parse(text) as unknown),
      thought: fc.option(fc.string({ unit: "grapheme", maxLength: 40 }), { nil: null }),
      gemini: fc.boolean(),
    }),
    { numRuns: RANDOM_VALUES, seed: SEED },
  );
  const python = askPython(calls.map((c) => ({ op: "peer_args", tool: c.tool, args: encodeValue(c.args), thought: c.thought, gemini: c.gemini })));
  const typescript = calls.map((c) =>
    answer(() => requestedEvent("oracle", c.tool, c.args, { ...ORACLE_FIELDS, toolCallId: null, gate: false, thought: c.thought, geminiKey: c.gemini })),
  );
  assertSame(typescript, python, (i) => calls[i]);
  assertWorkerAccepts(typescript);
  assert.ok(typescript.some((a) => "event" in a && "call_key" in a.event) && typescript.some((a) => "event" in a && "thought_hash" in a.event));

  const blanks = ["", " ", "\t\n", "\u00a0", "\ufeff", "\x1c", "\u2028", "\u3000x"];
  const messages = [...blanks, ...fc.sample(fc.string({ unit: "grapheme", maxLength: 30 }), { numRuns: 200, seed: SEED })].flatMap((text) =>
    (["agent", "user"] as const).map((source) => ({ text, source })),
  );
  const fromPython = askPython(messages.map((m) => ({ op: "message", ...m })));
  const fromTs = messages.map((m) => answer(() => agentMessageEvent("oracle", m.text, { ...ORACLE_FIELDS, source: m.source })));
  assertSame(fromTs, fromPython, (i) => messages[i]);
  assertWorkerAccepts(fromTs);
});
