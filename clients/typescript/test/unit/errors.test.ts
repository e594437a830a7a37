/**
 * The errors (src/errors.ts) carry the Python client's names for the same failures, with the
 * same families, as the Python side itself reports them (test/oracle.py reads streams.client
 * and schemas); every error the package exports derives from `LoopwatchError`; the old names
 * still catch what they caught.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as client from "../../src/index.js";
import * as openclaw from "../../src/openclaw/index.js";
import { askPython } from "../support/python.js";

type ErrorClass = abstract new (...args: never[]) => Error;

/** The names of the classes `cls` derives from, nearest first, up to (not including) Error. */
function ancestors(cls: ErrorClass): string[] {
  const names: string[] = [];
  for (let c = Object.getPrototypeOf(cls); c !== Error && c !== null && c !== Function.prototype; c = Object.getPrototypeOf(c)) {
    names.push(c.name);
  }
  return names;
}

function errorClasses(module: Record<string, unknown>): Map<string, ErrorClass> {
  const found = new Map<string, ErrorClass>();
  for (const [name, value] of Object.entries(module)) {
    if (typeof value === "function" && value.prototype instanceof Error) {
      found.set(name, value as ErrorClass);
    }
  }
  return found;
}

const exported = errorClasses(client as unknown as Record<string, unknown>);

test("the errors a runner meets have the Python client's names and families", () => {
  const [python] = askPython([{ op: "errors" }]) as [Record<string, string[]>];
  // What the Python side answers for its four families and the rest (a sanity check on the oracle).
  for (const name of ["LoopwatchError", "ConfigError", "BrokerAccessError", "NoDecisionError", "RunAbortedError", "LoopBlocked", "LoopwatchUnavailable"]) {
    assert.ok(name in python, `the oracle does not list ${name}: ${JSON.stringify(python)}`);
  }
  for (const [name, pythonAncestors] of Object.entries(python)) {
    const cls = exported.get(name);
    assert.ok(cls !== undefined, `the package exports no ${name}`);
    assert.equal(cls.name, name);
    assert.deepEqual(ancestors(cls), pythonAncestors, name);
  }
});

test("every error the package exports derives from LoopwatchError and says its name", () => {
  const decision = { type: "loop.decision", verdict_id: "v", tool_name: "read", message: "stop" } as unknown as client.Decision;
  const instances: Error[] = [
    new client.LoopBlocked(decision),
    new client.RunAbortedError("ended", "generic_repeat", 30, "read"),
    new client.PostCompactionLoopPersistedError("ended", "compaction_loop_persisted", 3, "read"),
    new client.LoopwatchUnavailable("x"),
    new client.NoDecisionError("x"),
    new client.BrokerAccessError("x"),
    new client.ConfigError("x"),
    new client.SigningKeyError("x"),
    new client.LoopwatchInputError("x"),
  ];
  for (const [name, cls] of exported) {
    assert.ok(cls === client.LoopwatchError || cls.prototype instanceof client.LoopwatchError, `${name} is not a LoopwatchError`);
  }
  for (const [name, cls] of errorClasses(openclaw as unknown as Record<string, unknown>)) {
    assert.ok(cls.prototype instanceof client.LoopwatchError, `openclaw's ${name} is not a LoopwatchError`);
  }
  assert.equal(instances.length, exported.size - 2); // all but LoopwatchError and the deprecated name
  for (const error of instances) {
    assert.ok(error instanceof client.LoopwatchError);
    assert.equal(error.name, error.constructor.name);
  }
});

test("the old names still catch what they caught", async () => {
  for (const error of [new client.LoopwatchUnavailable("x"), new client.NoDecisionError("x"), new client.BrokerAccessError("x")]) {
    assert.ok(error instanceof client.LoopwatchUnavailableError, error.name);
    assert.ok(!ancestors(error.constructor as ErrorClass).includes("LoopwatchUnavailableError"), error.name);
    await assert.rejects(Promise.reject(error), client.LoopwatchUnavailableError); // as a test of a catch would name it
  }
  for (const error of [
    new client.LoopwatchError("x"),
    new client.ConfigError("x"),
    new client.LoopwatchInputError("x"),
    new client.RunAbortedError("ended", "generic_repeat", 30, "read"),
    new Error("x"),
    "LoopwatchUnavailable",
    null,
  ]) {
    assert.ok(!(error instanceof client.LoopwatchUnavailableError), String(error));
  }
  assert.equal(openclaw.PluginConfigError, client.ConfigError);
  assert.equal(openclaw.ConfigError, client.ConfigError);
  assert.throws(() => openclaw.clientOptionsFromConfig({ brokers: [] }, {}), openclaw.PluginConfigError);
});
