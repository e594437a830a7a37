/**
 * The TypeScript framework adapters when loopwatch cannot answer, driven by each framework's
 * own loop: a silent broker (a real socket that never replies) makes every call time out, and
 * the adapter must fail open (the tool runs, a warning is logged) or, with `failClosed`, refuse
 * the call with a message saying why, which the model reads. Verdicts themselves are proved end
 * to end on the real broker (tests/integration/test_typescript_client.py).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { Agent, Runner, Usage, tool as agentsTool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents-core";
import { LoopwatchClient } from "../../src/client.js";
import { loopwatchAborted, withLoopwatch } from "../../src/integrations/aiSdk.js";
import { withLoopwatch as withGuardrails } from "../../src/integrations/openaiAgents.js";
import { captureLog, silentBroker } from "../support/offline.js";

const LIMIT = { timeout: 30_000 };
const UNAVAILABLE = /^Tool call blocked: loopwatch loop protection is unavailable \(no answer from loopwatch within 300 ms/;

async function offlineClient(failClosed: boolean) {
  const broker = await silentBroker();
  const log = captureLog();
  const client = new LoopwatchClient({
    brokers: [broker.address],
    timeoutMs: 300,
    startTimeoutMs: 5_000,
    connectTimeoutMs: 500,
    requestTimeoutMs: 500,
    failClosed,
    logger: log.logger,
  });
  const starting = client.start().catch(() => undefined); // still connecting when the calls come
  const close = async () => {
    await client.stop();
    await starting;
    await broker.close();
  };
  return { client, log, close };
}

function usage() {
  return {
    inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 1, text: 1, reasoning: undefined },
  };
}

/** One tool call, then an answer; returns what the model read of the call and whether the tool ran. */
async function aiSdkOnce(failClosed: boolean) {
  const { client, log, close } = await offlineClient(failClosed);
  const run = client.run({ runId: "r1", sessionKey: "agent:main:r1" });
  let ran = 0;
  const reads: unknown[] = [];
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      const last = options.prompt[options.prompt.length - 1];
      if (last?.role === "tool") {
        for (const part of last.content) if (part.type === "tool-result") reads.push(part.output);
        return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage: usage(), warnings: [] };
      }
      return {
        content: [{ type: "tool-call", toolCallId: "c1", toolName: "read", input: JSON.stringify({ path: "/x" }) }],
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage: usage(),
        warnings: [],
      };
    },
  });
  const read = tool({
    inputSchema: jsonSchema<{ path: string }>({ type: "object", properties: { path: { type: "string" } } }),
    execute: async () => {
      ran += 1;
      return "contents";
    },
  });
  const result = await generateText({ model, prompt: "read /x", tools: withLoopwatch({ read }, run), stopWhen: [stepCountIs(5), loopwatchAborted(run)] });
  await close();
  return { reads, ran, text: result.text, warnings: log.warnings };
}

test("AI SDK: loopwatch unreachable fails open: the tool runs, a warning is logged", LIMIT, async () => {
  const got = await aiSdkOnce(false);
  assert.equal(got.ran, 1);
  assert.deepEqual(got.reads, [{ type: "text", value: "contents" }]);
  assert.equal(got.text, "done");
  assert.ok(got.warnings.some((w) => /failing open \(read request\)/.test(w)), got.warnings.join("\n"));
});

test("AI SDK: loopwatch unreachable fails closed: the tool does not run, the model reads why", LIMIT, async () => {
  const got = await aiSdkOnce(true);
  assert.equal(got.ran, 0);
  assert.equal(got.reads.length, 1);
  const read = got.reads[0] as { type: string; value: string };
  assert.equal(read.type, "error-text");
  assert.match(read.value, UNAVAILABLE);
});

class OneCallModel implements Model {
  reads: unknown[] = [];
  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const usage = new Usage({ requests: 1, inputTokens: 1, outputTokens: 1, totalTokens: 2 });
    const results = typeof request.input === "string" ? [] : request.input.filter((i) => i.type === "function_call_result");
    if (results.length > 0) {
      this.reads.push(...results.map((r) => (r.type === "function_call_result" ? r.output : null)));
      return { usage, output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "done" }] }] };
    }
    return { usage, output: [{ type: "function_call", callId: "c1", name: "read", arguments: JSON.stringify({ path: "/x" }), status: "completed" }] };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not streamed");
  }
}

async function agentsOnce(failClosed: boolean) {
  const { client, log, close } = await offlineClient(failClosed);
  const run = client.run({ runId: "r1", sessionKey: "agent:main:r1" });
  let ran = 0;
  const read = agentsTool({
    name: "read",
    description: "read a file",
    parameters: { type: "object", properties: {}, required: [], additionalProperties: true },
    strict: false,
    execute: async () => {
      ran += 1;
      return "contents";
    },
  });
  const model = new OneCallModel();
  const agent = new Agent({ name: "main", model, tools: withGuardrails([read], run) });
  const result = await new Runner({ tracingDisabled: true }).run(agent, "read /x");
  await close();
  return { reads: model.reads, ran, text: result.finalOutput, warnings: log.warnings };
}

test("@openai/agents: loopwatch unreachable fails open: the tool runs, a warning is logged", LIMIT, async () => {
  const got = await agentsOnce(false);
  assert.equal(got.ran, 1);
  assert.deepEqual(got.reads, [{ type: "text", text: "contents" }]);
  assert.equal(got.text, "done");
  assert.ok(got.warnings.some((w) => /failing open \(read request\)/.test(w)), got.warnings.join("\n"));
});

test("@openai/agents: loopwatch unreachable fails closed: the tool does not run, the model reads why", LIMIT, async () => {
  const got = await agentsOnce(true);
  assert.equal(got.ran, 0);
  assert.equal(got.reads.length, 1);
  const read = got.reads[0] as { type: string; text: string };
  assert.equal(read.type, "text");
  assert.match(read.text, UNAVAILABLE);
});
