/**
 * A Node runner for the end-to-end tests on the real broker and a real worker
 * (tests/integration/test_typescript_client.py drives it). One JSON line in on stdin (the
 * plan), JSON lines out on stdout; the test decides what is right, from the engine.
 *
 *   node runner.js client   plan: {kafka, runs: [{runId, sessionKey, sessionId, mode, calls}]}
 *     Drives each run's calls through LoopwatchClient (gate or advisory) and reports every
 *     decision, warning, block and abort it surfaced. Then it waits for "dups N" on stdin
 *     (the test re-publishes N verdicts) and reports how many duplicates it dropped.
 *   node runner.js plugin   plan: {kafka, loopRun, abortRun, sessionKey}
 *     Drives the OpenClaw plugin through a fake plugin API object as OpenClaw's runtime
 *     calls it, and reports what the host would see: blocks, and the text the model reads.
 *   node runner.js text     plan: {kafka, runs: [{runId, sessionKey, events: [{k: "user"|"text", text}]}]}
 *     Streams each run's prompts and text through RunHandle.agentMessage / modelText (advisory),
 *     waits for the run's abort and reports the events' ids, the warnings and the abort.
 *   node runner.js ai-sdk   plan: {kafka, runId, abortRun, sessionKey, calls}
 *     The Vercel AI SDK's own loop (generateText, stopWhen) with its MockLanguageModelV3, through
 *     withLoopwatch: a script calling one tool with the same arguments `calls` times, then one
 *     whose loop survives a compaction; reports what the model read of each call, how often the
 *     tools really ran, the steps, and the abort. The first is README.md's snippet, run as it is.
 *   node runner.js openai-agents   plan: as ai-sdk
 *     The same two scripts through @openai/agents-core's Runner with a scripted Model (the SDK's
 *     own Model interface) and withLoopwatch's tool guardrails; reports as ai-sdk, and the
 *     tripwire the abort raised.
 *   node runner.js start    plan: {kafka}
 *     Starts a client and reports whether it started, or the error it failed with.
 *
 * `kafka` is the plugin's config (openclaw.plugin.json: brokers, topics, tls.caFile,
 * sasl.passwordEnv, signing.keyFile, ...), read by the plugin's own parser for every scenario.
 */
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { LoopwatchClient, type RunHandle } from "../../src/client.js";
import { LoopBlocked, RunAbortedError } from "../../src/errors.js";
import type { ToolOutcome } from "../../src/hashing.js";
import { clientOptionsFromConfig } from "../../src/openclaw/config.js";
import { registerLoopwatch } from "../../src/openclaw/plugin.js";
import type { Decision } from "../../src/verdicts.js";
import { FakeOpenClaw } from "../support/fake-openclaw.js";
import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { loopwatchAborted, withLoopwatch } from "../../src/integrations/aiSdk.js";
import { Agent, Runner, ToolCallError, ToolInputGuardrailTripwireTriggered, Usage, tool as agentsTool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents-core";
import { loopwatchRunOptions, withLoopwatch as withLoopwatchGuardrails } from "../../src/integrations/openaiAgents.js";

/** The plugin's config: brokers, topics, and for a secured cluster tls, sasl and signing. */
type KafkaPlan = Record<string, unknown>;

type Call = "compaction" | { tool: string; args: unknown; result?: unknown; error?: unknown };

interface RunPlan {
  runId: string | null;
  sessionKey: string;
  sessionId: string | null;
  mode: "gate" | "advisory";
  calls: Call[];
}

const input = createInterface({ input: process.stdin });
const queued: string[] = [];
const readers: ((line: string) => void)[] = [];
input.on("line", (line) => {
  const reader = readers.shift();
  if (reader) reader(line);
  else queued.push(line);
});

function nextLine(): Promise<string> {
  const line = queued.shift();
  return line !== undefined ? Promise.resolve(line) : new Promise((resolve) => readers.push(resolve));
}

/** The next command, which must be `<verb> <number>`. */
async function command(verb: string): Promise<number> {
  const [got, count] = (await nextLine()).split(" ");
  if (got !== verb) throw new Error(`expected "${verb} N", got "${got}"`);
  return Number(count);
}

function say(message: object): void {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

async function until(condition: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function outcomeOf(call: Exclude<Call, "compaction">): ToolOutcome {
  return call.error !== undefined ? { error: call.error } : { result: call.result };
}

// -- client ------------------------------------------------------------------------------------

interface RunReport {
  key: string;
  decisions: Decision[];
  blockedCalls: number[];
  abortError: { name: string; message: string; detector: string; count: number; toolName: string } | null;
  warnings: Decision[];
  blocked: Decision[];
  aborted: unknown;
}

async function driveRun(run: RunHandle, plan: RunPlan): Promise<RunReport> {
  const report: RunReport = { key: run.key, decisions: [], blockedCalls: [], abortError: null, warnings: [], blocked: [], aborted: null };
  for (const [n, call] of plan.calls.entries()) {
    if (call === "compaction") {
      await run.compactionRetried();
      continue;
    }
    const toolCallId = `call_${n}`;
    try {
      const decision = await run.beforeToolCall(call.tool, call.args, { toolCallId });
      if (decision) report.decisions.push(decision);
    } catch (err) {
      if (err instanceof LoopBlocked) {
        report.decisions.push(err.decision);
        report.blockedCalls.push(n);
      } else if (err instanceof RunAbortedError) {
        report.abortError = { name: err.name, message: err.message, detector: err.detector, count: err.count, toolName: err.toolName };
        break; // an obedient runner stops an aborted run
      } else {
        throw err;
      }
    }
    // A blocked call does not run; the client records its completion as the loop's own veto.
    await run.afterToolCall(call.tool, call.args, outcomeOf(call), { toolCallId });
  }
  if (plan.mode === "advisory") {
    // Verdicts arrive on their own: the test reads what was published, asks the engine how
    // many warnings and blocks that makes, and tells us.
    say({ event: "published", key: run.key });
    const expected = await command("expect");
    await until(() => run.warnings.length + run.blocked.length >= expected, 30_000, `${expected} verdicts for ${run.key}`);
  }
  report.warnings = [...run.warnings];
  report.blocked = [...run.blocked];
  report.aborted = run.aborted;
  await run.end(report.abortError ? "aborted" : "completed");
  return report;
}

async function clientScenario(plan: { kafka: KafkaPlan; runs: RunPlan[] }): Promise<void> {
  const common = { ...clientOptionsFromConfig(plan.kafka), timeoutMs: 15_000, failClosed: true, startTimeoutMs: 30_000 };
  const gate = new LoopwatchClient({ ...common, mode: "gate", clientId: "e2e-gate" });
  const advisory = new LoopwatchClient({ ...common, mode: "advisory", clientId: "e2e-advisory" });
  await Promise.all([gate.start(), advisory.start()]);
  say({ event: "ready" });
  const reports = await Promise.all(
    plan.runs.map((r) => {
      const client = r.mode === "gate" ? gate : advisory;
      return driveRun(client.run({ runId: r.runId, sessionKey: r.sessionKey, sessionId: r.sessionId, agentId: "main" }), r);
    }),
  );
  say({ event: "runs", runs: reports });
  // Both clients read every partition, so each must drop each re-published verdict.
  const expected = await command("dups");
  const done = () => gate.duplicatesDropped >= expected && advisory.duplicatesDropped >= expected;
  await until(done, 30_000, `${expected} duplicate verdicts`);
  await new Promise((resolve) => setTimeout(resolve, 500)); // anything more would show up now
  say({ event: "dups", dropped: { gate: gate.duplicatesDropped, advisory: advisory.duplicatesDropped } });
  await Promise.all([gate.stop(), advisory.stop()]);
}

// -- text ------------------------------------------------------------------------------------

interface TextRunPlan {
  runId: string;
  sessionKey: string;
  events: { k: "user" | "text"; text: string }[];
}

async function textScenario(plan: { kafka: KafkaPlan; runs: TextRunPlan[] }): Promise<void> {
  const options = { ...clientOptionsFromConfig(plan.kafka), timeoutMs: 15_000, failClosed: true, startTimeoutMs: 30_000 };
  const client = new LoopwatchClient({ ...options, mode: "advisory", clientId: "e2e-text" });
  await client.start();
  const reports = [];
  for (const r of plan.runs) {
    const run = client.run({ runId: r.runId, sessionKey: r.sessionKey, agentId: "main" });
    const eventIds: string[] = [];
    for (const e of r.events) {
      eventIds.push(e.k === "user" ? await run.agentMessage(e.text, { source: "user" }) : await run.modelText(e.text));
    }
    await until(() => run.aborted !== null, 30_000, `the abort of ${r.runId}`);
    reports.push({ runId: r.runId, eventIds, warnings: [...run.warnings], aborted: run.aborted, notices: run.takeModelNotices() });
  }
  say({ event: "runs", runs: reports });
  await client.stop();
}

// -- plugin ------------------------------------------------------------------------------------

interface HostCall {
  n: number;
  blocked: boolean;
  blockReason: string | null;
  /** The text of the tool result as the model reads it (after the tool-result middleware). */
  modelText: string[];
}

/**
 * One tool call as OpenClaw's runtime makes it: before_tool_call (a block becomes the blocked
 * result of buildBlockedToolResult), the tool, the tool-result middleware, then
 * after_tool_call fired without waiting (OpenClaw does not await it either).
 */
async function hostCall(api: FakeOpenClaw, ids: { runId: string; sessionKey: string }, n: number, tool: string, params: Record<string, unknown>, output: string, pending: Promise<unknown>[]): Promise<HostCall> {
  const toolCallId = `call_${n}`;
  const ctx = { ...ids, agentId: "main", toolName: tool, toolCallId };
  const before = (await api.emit("before_tool_call", { toolName: tool, params, runId: ids.runId, toolCallId }, ctx)) as
    | { block?: boolean; blockReason?: string }
    | undefined;
  const blocked = before?.block === true;
  const raw = blocked
    ? { content: [{ type: "text", text: before!.blockReason }], details: { status: "blocked", deniedReason: "plugin-before-tool-call", reason: before!.blockReason } }
    : { content: [{ type: "text", text: output }], details: { ok: true } };
  const seen = await api.passResult({ toolCallId, toolName: tool, args: params, result: raw }, { runtime: "openclaw", ...ids, agentId: "main" });
  pending.push(api.emit("after_tool_call", { toolName: tool, params, runId: ids.runId, toolCallId, result: seen }, ctx));
  const content = Array.isArray(seen.content) ? (seen.content as { text?: string }[]) : [];
  return { n, blocked, blockReason: blocked ? before!.blockReason ?? null : null, modelText: content.map((c) => c.text ?? "") };
}

async function pluginScenario(plan: { kafka: KafkaPlan; loopRun: string; abortRun: string; sessionKey: string }): Promise<void> {
  const api = new FakeOpenClaw({ ...plan.kafka, timeoutMs: 15_000, failClosed: true, startTimeoutMs: 30_000 });
  const plugin = registerLoopwatch(api);
  await plugin.client.start();
  say({ event: "ready" });
  const pending: Promise<unknown>[] = [];

  // A runner loops on one read: loopwatch warns (the model reads it), then blocks.
  const loopIds = { runId: plan.loopRun, sessionKey: plan.sessionKey };
  const loop: HostCall[] = [];
  for (let n = 0; n < 24; n += 1) {
    loop.push(await hostCall(api, loopIds, n, "read", { path: "/var/log/app.log" }, "no new lines", pending));
  }

  // A loop that survives a compaction: the abort reaches the runner, the next call is refused.
  const abortIds = { runId: plan.abortRun, sessionKey: plan.sessionKey };
  const abort: HostCall[] = [];
  let n = 0;
  for (; n < 3; n += 1) abort.push(await hostCall(api, abortIds, n, "read", { path: `/docs/${n}.md` }, `part ${n}`, pending));
  await api.emit("after_compaction", { messageCount: 12, compactedCount: 30 }, { ...abortIds, agentId: "main" });
  for (; n < 6; n += 1) abort.push(await hostCall(api, abortIds, n, "gateway", { action: "lookup" }, "same schema", pending));
  await Promise.all(pending.splice(0));
  const handle = plugin.client.run({ runId: plan.abortRun, sessionKey: plan.sessionKey, agentId: "main" });
  await until(() => handle.aborted !== null, 30_000, "the abort");
  const refused = await hostCall(api, abortIds, n, "gateway", { action: "lookup" }, "same schema", pending);
  n += 1;
  await Promise.all(pending.splice(0));
  // The run ends; its state is freed, so the same run id starts afresh.
  await api.emit("agent_end", { runId: plan.abortRun, messages: [], success: false }, { ...abortIds, agentId: "main" });
  const afterEnd = await hostCall(api, abortIds, n, "gateway", { action: "lookup" }, "same schema", pending);
  await Promise.all(pending.splice(0));

  say({ event: "plugin", loop, abort, refused, afterEnd, aborted: handle.aborted, warnings: api.warnings() });
  await plugin.stop();
}

// -- the README's snippets ------------------------------------------------------------------

/** The README's first `ts` block under `heading`, without its imports, with the test's ids. */
function readmeSnippet(heading: string, ids: { runId: string; sessionKey: string }): string {
  const readme = readFileSync(new URL("../../../README.md", import.meta.url), "utf8");
  const at = readme.indexOf(`## ${heading}\n`);
  const block = at < 0 ? null : /```ts\n([\s\S]*?)```/.exec(readme.slice(at));
  if (!block?.[1]) throw new Error(`README.md has no ts snippet under "## ${heading}"`);
  return block[1]
    .split("\n")
    .filter((line) => !line.startsWith("import "))
    .join("\n")
    .replaceAll('"run-42"', JSON.stringify(ids.runId))
    .replaceAll('"agent:main:42"', JSON.stringify(ids.sessionKey));
}

/** Run a snippet (plain JavaScript once its imports are gone) with `scope` as its free names. */
async function runSnippet<T>(code: string, scope: Record<string, unknown>, results: string[]): Promise<T> {
  const AsyncFunction = Object.getPrototypeOf(async () => undefined).constructor as new (...args: string[]) => (...values: unknown[]) => Promise<T>;
  return new AsyncFunction(...Object.keys(scope), `${code}\nreturn { ${results.join(", ")} };`)(...Object.values(scope));
}

// -- the Vercel AI SDK ------------------------------------------------------------------------

/** A tool result as the model reads it in its next prompt (LanguageModelV3ToolResultOutput). */
interface ModelRead {
  toolCallId: string;
  output: unknown;
}

function usage() {
  return {
    inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 5, text: 5, reasoning: undefined },
  };
}

/** The scripted model: `script(n)` is its n-th tool call (null: it answers); it records what it read. */
function scriptedModel(script: (n: number) => { tool: string; args: unknown } | null, read: ModelRead[], beforeStep?: (n: number) => Promise<void>) {
  let made = 0;
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      const last = options.prompt[options.prompt.length - 1];
      if (last?.role === "tool") {
        for (const part of last.content) {
          if (part.type === "tool-result") read.push({ toolCallId: part.toolCallId, output: part.output });
        }
      }
      await beforeStep?.(made);
      const call = script(made);
      if (call !== null) {
        made += 1;
        return {
          content: [{ type: "tool-call", toolCallId: `call_${made - 1}`, toolName: call.tool, input: JSON.stringify(call.args) }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" },
          usage: usage(),
          warnings: [],
        };
      }
      return { content: [{ type: "text", text: "giving up" }], finishReason: { unified: "stop", raw: "stop" }, usage: usage(), warnings: [] };
    },
  });
  return { model, made: () => made };
}

const anyObject = jsonSchema<Record<string, unknown>>({ type: "object" });

async function aiSdkScenario(plan: { kafka: KafkaPlan; runId: string; abortRun: string; unknownRun: string; sessionKey: string; calls: number }): Promise<void> {
  const client = new LoopwatchClient({ ...clientOptionsFromConfig(plan.kafka), mode: "gate", timeoutMs: 15_000, failClosed: true, startTimeoutMs: 30_000, clientId: "e2e-ai-sdk" });
  await client.start();
  say({ event: "ready" });
  const executed: Record<string, number> = {};
  const counted = (name: string, output: string) =>
    tool({
      description: name,
      inputSchema: anyObject,
      execute: async () => {
        executed[name] = (executed[name] ?? 0) + 1;
        return output;
      },
    });

  // A loop on one read: warned at the 11th call, refused from the 21st.
  // The README's snippet, as it is.
  const read: ModelRead[] = [];
  const looping = scriptedModel((n) => (n < plan.calls ? { tool: "read_log", args: { path: "/var/log/app.log" } } : null), read);
  const { result } = await runSnippet<{ result: Awaited<ReturnType<typeof generateText>> }>(
    readmeSnippet("The Vercel AI SDK", plan),
    { client, model: looping.model, prompt: "Wait for the deploy to show up in the log.", read_log: counted("read_log", "no new lines"), generateText, stepCountIs, withLoopwatch, loopwatchAborted },
    ["result"],
  );

  // A loop that survives a compaction: loopwatch aborts the run, loopwatchAborted ends the loop.
  const abortRun = client.run({ runId: plan.abortRun, sessionKey: plan.sessionKey, agentId: "main" });
  const abortRead: ModelRead[] = [];
  const persisting = scriptedModel(
    (n) => (n < 3 ? { tool: "read", args: { path: `/docs/${n}.md` } } : n < 15 ? { tool: "gateway", args: { action: "lookup" } } : null),
    abortRead,
    async (n) => {
      if (n === 3) await abortRun.compactionRetried(); // the host compacted its context and retries
    },
  );
  const abortResult = await generateText({
    model: persisting.model,
    prompt: "Look the schema up.",
    tools: withLoopwatch({ read: counted("read", "part"), gateway: counted("gateway", "same schema") }, abortRun),
    stopWhen: [stepCountIs(20), loopwatchAborted(abortRun)],
  });
  let checked: { name: string; message: string } | null = null;
  try {
    abortRun.check();
  } catch (err) {
    checked = { name: (err as Error).name, message: (err as Error).message };
  }
  await abortRun.end("aborted");

  // A call of a tool that is not in `tools`: the SDK answers it with its own error, and
  // loopwatchAborted publishes it with the unknown-tool outcome after its step.
  const unknownRun = client.run({ runId: plan.unknownRun, sessionKey: plan.sessionKey, agentId: "main" });
  const unknownRead: ModelRead[] = [];
  const guessing = scriptedModel((n) => (n < 1 ? { tool: "lookup_weather", args: { city: "Oslo" } } : null), unknownRead);
  const unknownResult = await generateText({
    model: guessing.model,
    prompt: "What is the weather?",
    tools: withLoopwatch({ read: counted("read", "part") }, unknownRun),
    stopWhen: [stepCountIs(5), loopwatchAborted(unknownRun)],
  });
  await unknownRun.end("completed");

  say({
    event: "ai-sdk",
    loop: { read, executed: executed.read_log ?? 0, steps: result.steps.length, text: result.text },
    abort: { read: abortRead, executed, made: persisting.made(), steps: abortResult.steps.length, aborted: abortRun.aborted, checked },
    unknown: { read: unknownRead, steps: unknownResult.steps.length, text: unknownResult.text },
  });
  await client.stop();
}

// -- the OpenAI Agents SDK (TypeScript) -------------------------------------------------------

/** A model on the SDK's own `Model` interface: `script(n)` is its n-th call (null: it answers). */
class ScriptedAgentsModel implements Model {
  made = 0;
  readonly #seen = new Set<string>();
  constructor(
    readonly script: (n: number) => { tool: string; args: unknown } | null,
    readonly read: ModelRead[],
    readonly beforeStep?: (n: number) => Promise<void>,
  ) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    for (const item of typeof request.input === "string" ? [] : request.input) {
      if (item.type === "function_call_result" && !this.#seen.has(item.callId)) {
        this.#seen.add(item.callId);
        this.read.push({ toolCallId: item.callId, output: item.output });
      }
    }
    await this.beforeStep?.(this.made);
    const call = this.script(this.made);
    const usage = new Usage({ requests: 1, inputTokens: 10, outputTokens: 5, totalTokens: 15 });
    if (call === null) {
      return { usage, output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "giving up" }] }] };
    }
    this.made += 1;
    return {
      usage,
      output: [{ type: "function_call", callId: `call_${this.made - 1}`, name: call.tool, arguments: JSON.stringify(call.args), status: "completed" }],
    };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

/** The SDK's Runner with tracing off (nothing to export it to here), as a host configures it. */
class QuietRunner extends Runner {
  constructor(config: ConstructorParameters<typeof Runner>[0] = {}) {
    super({ tracingDisabled: true, ...config });
  }
}

async function openaiAgentsScenario(plan: { kafka: KafkaPlan; runId: string; abortRun: string; unknownRun: string; sessionKey: string; calls: number }): Promise<void> {
  const client = new LoopwatchClient({ ...clientOptionsFromConfig(plan.kafka), mode: "gate", timeoutMs: 15_000, failClosed: true, startTimeoutMs: 30_000, clientId: "e2e-openai-agents" });
  await client.start();
  say({ event: "ready" });
  const runner = new Runner({ tracingDisabled: true });
  const executed: Record<string, number> = {};
  const counted = (name: string, output: string) =>
    agentsTool({
      name,
      description: name,
      parameters: { type: "object", properties: {}, required: [], additionalProperties: true },
      strict: false,
      execute: async () => {
        executed[name] = (executed[name] ?? 0) + 1;
        return output;
      },
    });

  // A loop on one read: warned at the 11th call, refused from the 21st.
  // The README's snippet, as it is.
  const read: ModelRead[] = [];
  const looping = new ScriptedAgentsModel((n) => (n < plan.calls ? { tool: "read_log", args: { path: "/var/log/app.log" } } : null), read);
  const { result } = await runSnippet<{ result: { finalOutput: unknown } }>(
    readmeSnippet("The OpenAI Agents SDK (TypeScript)", plan),
    { client, Agent, Runner: QuietRunner, model: looping, prompt: "Wait for the deploy to show up in the log.", readLog: counted("read_log", "no new lines"), withLoopwatch: withLoopwatchGuardrails, loopwatchRunOptions },
    ["result"],
  );

  // A loop that survives a compaction: the abort trips the input guardrail's tripwire.
  const abortRun = client.run({ runId: plan.abortRun, sessionKey: plan.sessionKey, agentId: "main" });
  const abortRead: ModelRead[] = [];
  const persisting = new ScriptedAgentsModel(
    (n) => (n < 3 ? { tool: "read", args: { path: `/docs/${n}.md` } } : n < 15 ? { tool: "gateway", args: { action: "lookup" } } : null),
    abortRead,
    async (n) => {
      if (n === 3) await abortRun.compactionRetried(); // the host compacted its context and retries
    },
  );
  const abortAgent = new Agent({ name: "main", model: persisting, tools: withLoopwatchGuardrails([counted("read", "part"), counted("gateway", "same schema")], abortRun) });
  let tripwire: { name: string; cause: string; guardrail: string; info: { name: string; message: string } } | null = null;
  let finished: unknown = null;
  try {
    finished = (await runner.run(abortAgent, "Look the schema up.", { maxTurns: 20 })).finalOutput;
  } catch (err) {
    // The SDK's runner wraps what a tool call raised, the tripwire included, in ToolCallError.
    const cause = err instanceof ToolCallError ? err.error : err;
    if (!(cause instanceof ToolInputGuardrailTripwireTriggered)) throw err;
    const info = cause.result.output.outputInfo as Error;
    tripwire = { name: (err as Error).name, cause: cause.name, guardrail: cause.result.guardrail.name, info: { name: info.name, message: info.message } };
  }
  await abortRun.end("aborted");

  // A call of a tool the agent does not have: returned to the model as the SDK's error, and
  // published with the unknown-tool outcome through loopwatchRunOptions.
  const unknownRun = client.run({ runId: plan.unknownRun, sessionKey: plan.sessionKey, agentId: "main" });
  const unknownRead: ModelRead[] = [];
  const guessing = new ScriptedAgentsModel((n) => (n < 1 ? { tool: "lookup_weather", args: { city: "Oslo" } } : null), unknownRead);
  const unknownAgent = new Agent({ name: "main", model: guessing, tools: withLoopwatchGuardrails([counted("read", "part")], unknownRun) });
  const unknownResult = await runner.run(unknownAgent, "What is the weather?", { maxTurns: 5, ...loopwatchRunOptions(unknownRun) });
  await unknownRun.end("completed");

  say({
    event: "openai-agents",
    loop: { read, executed: executed.read_log ?? 0, made: looping.made, text: result.finalOutput },
    abort: { read: abortRead, executed, made: persisting.made, aborted: abortRun.aborted, tripwire, finished },
    unknown: { read: unknownRead, text: unknownResult.finalOutput },
  });
  await client.stop();
}

// -- start -------------------------------------------------------------------------------------

async function startScenario(plan: { kafka: KafkaPlan }): Promise<void> {
  const client = new LoopwatchClient({ ...clientOptionsFromConfig(plan.kafka), startTimeoutMs: 30_000 });
  const began = Date.now();
  try {
    await client.start();
    say({ event: "start", ok: true });
  } catch (err) {
    const error = err as Error;
    say({ event: "start", ok: false, name: error.name, message: error.message, ms: Date.now() - began });
  } finally {
    await client.stop();
  }
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const scenario = process.argv[2];
  const plan = JSON.parse(await nextLine());
  if (scenario === "client") {
    await clientScenario(plan);
  } else if (scenario === "plugin") {
    await pluginScenario(plan);
  } else if (scenario === "start") {
    await startScenario(plan);
  } else if (scenario === "openai-agents") {
    await openaiAgentsScenario(plan);
  } else if (scenario === "ai-sdk") {
    await aiSdkScenario(plan);
  } else if (scenario === "text") {
    await textScenario(plan);
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  input.close();
  process.exit(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
