/**
 * A broker that cannot be reached gives the configured behaviour, never a hang: fail open
 * (the call goes on, with a warning) by default, fail closed on request. Each test has a
 * hard time limit far above the configured timeouts: a hang fails it.
 *
 * The brokers here are real sockets that refuse or never answer; nothing about Kafka is faked.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { LoopwatchClient } from "../../src/client.js";
import { LoopwatchError, LoopwatchInputError, LoopwatchUnavailable, LoopwatchUnavailableError, NoDecisionError } from "../../src/errors.js";
import { captureLog, refusingBroker, silentBroker, type DeadBroker } from "../support/offline.js";

const LIMIT = { timeout: 30_000 };

function client(broker: DeadBroker, options: Partial<ConstructorParameters<typeof LoopwatchClient>[0]> = {}) {
  const log = captureLog();
  const c = new LoopwatchClient({
    brokers: [broker.address],
    timeoutMs: 300,
    startTimeoutMs: 1_000,
    connectTimeoutMs: 500,
    requestTimeoutMs: 500,
    logger: log.logger,
    ...options,
  });
  return { c, log };
}

for (const [kind, makeBroker] of [["refused", refusingBroker], ["silent", silentBroker]] as const) {
  test(`${kind} broker: start() gives up with a clear error`, LIMIT, async () => {
    const broker = await makeBroker();
    const { c } = client(broker);
    const refused = await c.start().then(() => null, (err: unknown) => err);
    assert.ok(refused instanceof LoopwatchUnavailable, String(refused));
    assert.equal((refused as Error).name, "LoopwatchUnavailable");
    // The deprecated name still catches it, and so does the root.
    assert.ok(refused instanceof LoopwatchUnavailableError && refused instanceof LoopwatchError);
    await c.stop();
    await broker.close();
  });

  test(`${kind} broker, gate mode: a call fails open with a warning`, LIMIT, async () => {
    const broker = await makeBroker();
    const { c, log } = client(broker);
    const starting = c.start().catch(() => undefined); // still connecting when the call comes
    const run = c.run({ runId: "r1", sessionKey: "s" });
    assert.equal(await run.beforeToolCall("read", { path: "/x" }, { toolCallId: "c1" }), null);
    await run.afterToolCall("read", { path: "/x" }, { result: "ok" }, { toolCallId: "c1" });
    assert.ok(log.warnings.some((w) => /no answer from loopwatch within 300 ms.*failing open/.test(w)), log.warnings.join("\n"));
    await starting;
    await c.stop();
    await broker.close();
  });

  test(`${kind} broker, gate mode, fail closed: the call is refused`, LIMIT, async () => {
    const broker = await makeBroker();
    const { c } = client(broker, { failClosed: true });
    const starting = c.start().catch(() => undefined);
    const run = c.run({ runId: "r1", sessionKey: "s" });
    await assert.rejects(run.beforeToolCall("read", { path: "/x" }), { name: "NoDecisionError", message: /no answer from loopwatch within 300 ms/ });
    await assert.rejects(run.afterToolCall("read", { path: "/x" }, { result: "ok" }), NoDecisionError);
    await assert.rejects(run.compactionRetried(), LoopwatchUnavailableError); // the deprecated name still catches it
    await starting;
    await c.stop();
    await broker.close();
  });

  test(`${kind} broker, advisory mode: publishing is bounded by the timeout too`, LIMIT, async () => {
    const broker = await makeBroker();
    const open = client(broker, { mode: "advisory" });
    const closed = client(broker, { mode: "advisory", failClosed: true });
    const starts = [open.c.start().catch(() => undefined), closed.c.start().catch(() => undefined)];
    assert.equal(await open.c.run({ runId: "r1" }).beforeToolCall("read", {}), null);
    await assert.rejects(closed.c.run({ runId: "r1" }).beforeToolCall("read", {}), NoDecisionError);
    await Promise.all(starts);
    await Promise.all([open.c.stop(), closed.c.stop()]);
    await broker.close();
  });
}

test("a call before start() fails open (or closed) at once: nothing to wait for", LIMIT, async () => {
  const broker = await silentBroker();
  const open = client(broker);
  assert.equal(await open.c.run({ runId: "r" }).beforeToolCall("read", {}), null);
  assert.match(open.log.warnings.join("\n"), /not started \(call start\(\) first\)/);
  const closed = client(broker, { failClosed: true });
  await assert.rejects(closed.c.run({ runId: "r" }).beforeToolCall("read", {}), /not started/);
  await Promise.all([open.c.stop(), closed.c.stop()]);
  await broker.close();
});

test("bad input is the caller's error whatever the failure policy, and nothing waits for Kafka", LIMIT, async () => {
  const broker = await silentBroker();
  const { c } = client(broker, { timeoutMs: 60_000 }); // a publish would wait a minute: bad input must not
  const run = c.run({ runId: "r", sessionKey: "s" });
  const hostile = { get x(): never { throw new Error("no reading me"); } };
  await assert.rejects(run.beforeToolCall("read", hostile), LoopwatchInputError);
  await assert.rejects(run.afterToolCall("t".repeat(300), {}, { result: 1 }), { name: "LoopwatchInputError", message: /tool_name is 300 characters long/ });
  assert.throws(() => c.run({}), { name: "LoopwatchInputError", message: /run_id, session_key or session_id is required/ });
  await c.stop();
  await broker.close();
});

test("stop() ends pending calls and does not hang on a silent broker", LIMIT, async () => {
  const broker = await silentBroker();
  const { c } = client(broker, { timeoutMs: 60_000, startTimeoutMs: 60_000 });
  const starting = c.start().catch(() => undefined);
  const pending = c.run({ runId: "r" }).beforeToolCall("read", {});
  await new Promise((resolve) => setTimeout(resolve, 200));
  await c.stop();
  assert.equal(await pending, null); // failed open: the client was stopped
  await starting;
  await broker.close();
});
