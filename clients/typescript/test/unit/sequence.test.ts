/**
 * The `seq` the client numbers every event with (`src/sequence.ts`): hand-worked numbers over a
 * clock that stalls, steps back and jumps; a restarted publisher continuing above its
 * predecessor; a property over random clocks; and the numbered events as the worker reads them
 * (the JSON Schema, and Python's own decoder re-encoding them to the same bytes).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import Ajv from "ajv";
import fc from "fast-check";
import { agentMessageEvent, compactionEvent, encodeEvent, requestedEvent, runEndedEvent, type EventFields, type ToolCallEvent } from "../../src/events.js";
import { LoopwatchInputError } from "../../src/errors.js";
import { SeqCounter, nowMicros, numbered } from "../../src/sequence.js";
import { askPython } from "../support/python.js";
import { SCHEMA_DIR } from "../support/paths.js";

const FIELDS: EventFields = { run_id: "run-1", session_key: "agent:main:1", session_id: null, agent_id: "main", tsMs: 1_700_000_000_000 };

function drawn(readings: readonly number[]): number[] {
  let at = 0;
  const counter = new SeqCounter(() => readings[at++]!);
  return readings.map(() => counter.next());
}

test("hand-worked: the numbers follow the clock (µs) and never fall back", () => {
  // Clock: 1000, 1000, 1000, 500 (stepped back), 5000, 4999.
  assert.deepEqual(drawn([1000, 1000, 1000, 500, 5000, 4999]), [1000, 1001, 1002, 1003, 5000, 5001]);
});

test("a publisher restarted later continues above its predecessor", () => {
  // The predecessor drew 5 numbers within one microsecond (1,760,000,000,000,001 µs); the
  // restarted one starts 2 s later by its clock.
  const before = drawn(Array(5).fill(1_760_000_000_000_001));
  assert.deepEqual(before, [1_760_000_000_000_001, 1_760_000_000_000_002, 1_760_000_000_000_003, 1_760_000_000_000_004, 1_760_000_000_000_005]);
  assert.deepEqual(drawn([1_760_000_002_000_001, 1_760_000_002_000_001]), [1_760_000_002_000_001, 1_760_000_002_000_002]);
});

test("property: over any clock, numbers rise strictly and are at least the clock", () => {
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 0, max: 4_000_000_000_000_000 }), { minLength: 1, maxLength: 60 }), (readings) => {
      const out = drawn(readings);
      return out.every((seq, i) => seq >= readings[i]! && (i === 0 || seq > out[i - 1]!));
    }),
    { numRuns: 300, seed: 11 },
  );
});

test("a number past the safe integers is refused", () => {
  assert.throws(() => new SeqCounter(() => 2 ** 53).next(), RangeError);
});

test("every event the client publishes gets a rising seq, its last field, which the worker's decoder keeps", () => {
  const events: ToolCallEvent[] = [
    requestedEvent("e1", "read", { path: "/x" }, { ...FIELDS, toolCallId: "c1", gate: true }),
    compactionEvent("e2", FIELDS),
    agentMessageEvent("e3", "hello", FIELDS),
    runEndedEvent("e4", "completed", FIELDS),
  ];
  const floor = nowMicros();
  const out = events.map((e) => numbered(e));
  const seqs = out.map((e) => e.seq!);
  assert.ok(seqs[0]! >= floor, `${seqs[0]} is below the clock ${floor}`);
  assert.ok(seqs.every((s, i) => i === 0 || s > seqs[i - 1]!), String(seqs));
  const wires = out.map((e) => encodeEvent(e).toString("utf8"));
  wires.forEach((wire, i) => assert.ok(wire.endsWith(`,"seq":${seqs[i]}}`), wire));
  const ajv = new Ajv.default({ strict: false, allErrors: true });
  const validate = ajv.compile(JSON.parse(readFileSync(join(SCHEMA_DIR, "tool-calls.event.v1.json"), "utf8")) as object);
  for (const wire of wires) {
    assert.ok(validate(JSON.parse(wire)), `${wire}: ${ajv.errorsText(validate.errors)}`);
  }
  assert.deepEqual(askPython(wires.map((wire) => ({ op: "decode", wire }))), wires.map((wire) => ({ wire })));
  // A seq already set is kept; a bad one is refused before anything is sent.
  assert.equal(numbered({ ...events[1]!, seq: 7 }).seq, 7);
  for (const bad of [-1, 1.5, 2 ** 53]) {
    assert.throws(() => encodeEvent({ ...events[1]!, seq: bad }), LoopwatchInputError);
  }
});
