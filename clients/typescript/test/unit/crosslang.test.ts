/**
 * The same hash for every case: TypeScript hashing against the project's own Python
 * (`streams/edge.py` over `streams/hashing.py`), on the shared conformance vectors'
 * arguments and outcomes and on 10,000+ random values of each kind with JavaScript's edge
 * cases. Values cross to Python losslessly (test/support/transport.ts).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { argsHash, hashOutcome, isKnownPoll, type ToolOutcome } from "../../src/hashing.js";
import { eventKey, stateKey } from "../../src/events.js";
import { argsCase, outcomeCase, SEND_TOOLS } from "../support/arbitraries.js";
import { conformanceCasesPath } from "../support/paths.js";
import { askPython } from "../support/python.js";
import { decodeValue, encodeValue } from "../support/transport.js";
import { compatibilityPartitioner } from "@platformatic/kafka";

const RANDOM_VALUES = 10_000;
const SEED = Number(process.env.LOOPWATCH_FC_SEED ?? 20261201);

interface PythonOutcome {
  args_hash: string;
  result_hash: string | null;
  unknown_tool_name: string | null;
  is_error: boolean;
  loop_veto: boolean;
}

/** Both languages overflow their stack on the same inputs (upstream does too). */
function orOverflow<T>(compute: () => T): T | { failed: "recursion" } {
  try {
    return compute();
  } catch (err) {
    if (err instanceof RangeError && /call stack/i.test(err.message)) {
      return { failed: "recursion" };
    }
    throw err;
  }
}

function tsOutcome(tool: string, args: unknown, outcome: ToolOutcome, sendTools: readonly string[]) {
  return orOverflow(() => tsOutcomeOf(tool, args, outcome, sendTools));
}

function tsOutcomeOf(tool: string, args: unknown, outcome: ToolOutcome, sendTools: readonly string[]): PythonOutcome {
  const hashed = hashOutcome(tool, args, outcome, new Set(sendTools));
  return {
    args_hash: argsHash(tool, args),
    result_hash: hashed.resultHash,
    unknown_tool_name: hashed.unknownToolName,
    is_error: hashed.isError,
    loop_veto: hashed.loopVeto,
  };
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

test(`${RANDOM_VALUES} random argument values hash the same in TypeScript and Python (seed ${SEED})`, () => {
  const cases = fc.sample(argsCase, { numRuns: RANDOM_VALUES, seed: SEED });
  const python = askPython(cases.map(({ tool, args }) => ({ op: "args", tool, args: encodeValue(args) })));
  const typescript = cases.map(({ tool, args }) => ({ args_hash: argsHash(tool, args), known_poll: isKnownPoll(tool, args) }));
  assertSame(typescript, python, (i) => ({ tool: cases[i]!.tool, args: encodeValue(cases[i]!.args) }));
});

test(`${RANDOM_VALUES} random tool outcomes hash the same in TypeScript and Python (seed ${SEED})`, () => {
  const cases = fc.sample(outcomeCase, { numRuns: RANDOM_VALUES, seed: SEED + 1 });
  const python = askPython(cases.map(({ tool, args, outcome }) => outcomeRequest(tool, args, outcome, SEND_TOOLS)));
  const typescript = cases.map(({ tool, args, outcome }) => tsOutcome(tool, args, outcome, SEND_TOOLS));
  assertSame(typescript, python, (i) => outcomeRequest(cases[i]!.tool, cases[i]!.args, cases[i]!.outcome, SEND_TOOLS));
  // The generator must actually reach the rules it is meant to test.
  const reached = new Set(typescript.map((t) => ("failed" in t ? "overflow" : t.loop_veto ? "veto" : t.is_error ? (t.unknown_tool_name ? "unknown" : "error") : t.result_hash === null ? "none" : "hash")));
  assert.deepEqual([...reached].sort(), ["error", "hash", "none", "overflow", "unknown", "veto"]);
});

test("the conformance vectors' arguments and outcomes hash the same in TypeScript and Python", () => {
  const [items] = askPython([{ op: "cases", path: conformanceCasesPath() }]) as [
    { case: string; tool: string; args: unknown; result?: unknown; error?: unknown; outcome?: boolean; send_tools: string[]; python: Record<string, unknown> }[],
  ];
  assert.ok(items.length > 1_000, `only ${items.length} tool calls in the vectors`);
  let outcomes = 0;
  for (const item of items) {
    const args = decodeValue(item.args);
    if ("error" in item || "result" in item || item.outcome) {
      outcomes += 1;
      const outcome: ToolOutcome = "error" in item ? { error: decodeValue(item.error) } : { result: decodeValue(item.result) };
      assert.deepStrictEqual(tsOutcome(item.tool, args, outcome, item.send_tools), item.python, `${item.case}: ${item.tool}`);
    } else {
      assert.deepStrictEqual({ args_hash: argsHash(item.tool, args), known_poll: isKnownPoll(item.tool, args) }, item.python, `${item.case}: ${item.tool}`);
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
