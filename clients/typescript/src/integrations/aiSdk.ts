/**
 * loopwatch for the Vercel AI SDK (npm `ai`, v6): a wrapper around each tool's `execute`.
 *
 *   const run = client.run({ runId: "run-42", sessionKey: "agent:main:42", agentId: "main" });
 *   const result = await generateText({ model, prompt,
 *     tools: withLoopwatch({ search, fetch }, run),
 *     stopWhen: [stepCountIs(30), loopwatchAborted(run)] });
 *   run.check(); await run.end("completed"); // check() throws RunAbortedError if loopwatch ended it
 *
 * The SDK has no hook that can refuse a call, but whatever `execute` throws becomes a
 * `tool-error` result whose message the model reads, and the loop goes on. So:
 *
 * * before the tool runs, the request is published (gate mode: its decision awaited); a block
 *   throws `LoopBlocked` (the model reads loopwatch's message; the tool does not run);
 * * an abort throws `RunAbortedError` the same way, and `loopwatchAborted(run)`, a stop
 *   condition, ends the loop after that step (the SDK's way to end a run);
 * * a warning loopwatch asks to show (`notify_model`) is appended to that call's result as the
 *   model sees it, through the tool's `toModelOutput`: the output the caller and loopwatch's hash
 *   see is the tool's own;
 * * after the tool ran, its output (or the message of what it threw) is published;
 * * a call of a tool that is not in `tools` never reaches a wrapper: the SDK answers it itself
 *   (a `tool-error` the model reads). `loopwatchAborted(run)` publishes it after its step, as
 *   requested and completed with the unknown-tool error ("Unknown tool: name") the engine's
 *   unknown-tool detector reads, as the Python adapters do. The model has read the SDK's
 *   message by then, so a block of it only counts; an abort still ends the loop there.
 *
 * Only types come from `ai`, so this module loads without it.
 */
import type { StepResult, StopCondition, Tool, ToolExecutionOptions, ToolSet } from "ai";
import type { RunHandle } from "../client.js";
import {
  BrokerAccessError,
  LoopBlocked,
  LoopwatchInputError,
  LoopwatchUnavailable,
  NoDecisionError,
  RunAbortedError,
} from "../errors.js";
import type { ToolOutcome } from "../hashing.js";

/**
 * The detectors whose block is the refusal of a call of a run loopwatch has aborted
 * (the engine's `refused_after_abort` names the abort's detector): the abort verdict itself
 * may still be on its way when the block arrives.
 */
const ABORT_DETECTORS = new Set(["compaction_loop_persisted", "critical_block_limit"]);
/** Runs refused with an abort detector's block, before their abort verdict arrived. */
const ending = new WeakSet<RunHandle>();

/** Tool calls whose notices wait for their `toModelOutput` (a call that threw never takes them). */
const MAX_PENDING_NOTICES = 1_024;

type ModelOutput = Awaited<ReturnType<NonNullable<Tool["toModelOutput"]>>>;
type Execute = NonNullable<Tool["execute"]>;

/**
 * `tools` with loopwatch guarding each tool that has an `execute` (the others, run by the
 * provider or by the client, are returned as they are). A new object; the tools are copies.
 */
export function withLoopwatch<TOOLS extends ToolSet>(tools: TOOLS, run: RunHandle): TOOLS {
  const notices = new Map<string, string[]>();
  const guarded: Record<string, Tool> = {};
  for (const [name, tool] of Object.entries(tools) as [string, Tool][]) {
    guarded[name] = tool.execute === undefined ? tool : guardTool(name, tool, tool.execute, run, notices);
  }
  return guarded as TOOLS;
}

/** Unknown-tool calls already published, by run (a stop condition sees every step again). */
const publishedUnknown = new WeakMap<RunHandle, Set<string>>();

/**
 * A stop condition: true once loopwatch has aborted `run` (the step that learnt it is the last).
 * It also publishes the step's calls of tools the agent does not have.
 */
// `any`, as the SDK's own `stepCountIs`: a stop condition must fit every call's tool set.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function loopwatchAborted(run: RunHandle): StopCondition<any> {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  return async ({ steps }: { steps: StepResult<any>[] }) => {
    const last = steps[steps.length - 1];
    if (last !== undefined) await publishUnknownTools(last, run);
    return run.aborted !== null || ending.has(run);
  };
}

/** The SDK's error for a call of a tool it does not have (by name: only types come from `ai`). */
function isNoSuchTool(error: unknown): boolean {
  return typeof error === "object" && error !== null && (error as { name?: unknown }).name === "AI_NoSuchToolError";
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
async function publishUnknownTools(step: StepResult<any>, run: RunHandle): Promise<void> {
  let seen = publishedUnknown.get(run);
  for (const part of step.content) {
    if (part.type !== "tool-call" || !("invalid" in part) || !part.invalid || !isNoSuchTool(part.error)) continue;
    if (seen === undefined) publishedUnknown.set(run, (seen = new Set()));
    if (seen.has(part.toolCallId)) continue;
    seen.add(part.toolCallId);
    let decision;
    try {
      decision = await run.beforeToolCall(part.toolName, part.input, { toolCallId: part.toolCallId });
    } catch (err) {
      if (err instanceof LoopBlocked || err instanceof RunAbortedError) {
        if (err instanceof LoopBlocked && ABORT_DETECTORS.has(err.detector ?? "")) ending.add(run);
        continue; // refused: nothing ran, so there is no outcome to publish
      }
      if (err instanceof NoDecisionError || err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError || err instanceof LoopwatchInputError) {
        run.client.logger.warn(`the call of the unknown tool ${part.toolName} was not published: ${err.message}`);
        continue;
      }
      throw err;
    }
    if (decision?.action === "block") {
      if (ABORT_DETECTORS.has(decision.detector ?? "")) ending.add(run);
      continue;
    }
    await publishOutcome(part.toolName, part.input, { error: new Error(`Unknown tool: ${part.toolName}`) }, part.toolCallId, run);
  }
}

function guardTool(name: string, tool: Tool, execute: Execute, run: RunHandle, notices: Map<string, string[]>): Tool {
  const guardedExecute = async (input: unknown, options: ToolExecutionOptions): Promise<unknown> => {
    const toolCallId = options.toolCallId;
    const watched = await admit(name, input, toolCallId, run, notices);
    const publish = (outcome: ToolOutcome) => (watched ? publishOutcome(name, input, outcome, toolCallId, run) : Promise.resolve());
    let output: unknown;
    try {
      output = await execute(input as never, options);
    } catch (err) {
      notices.delete(toolCallId);
      await publish({ error: err instanceof Error ? err.message : err });
      throw err;
    }
    if (isAsyncIterable(output)) {
      return streamed(output, publish); // preliminary results: the last one is the outcome
    }
    await publish({ result: output });
    return output;
  };
  const toModelOutput = async (options: { toolCallId: string; input: unknown; output: unknown }): Promise<ModelOutput> => {
    const own: ModelOutput = tool.toModelOutput
      ? await tool.toModelOutput(options as never)
      : typeof options.output === "string"
        ? { type: "text", value: options.output }
        : { type: "json", value: (options.output ?? null) as never };
    const texts = notices.get(options.toolCallId);
    notices.delete(options.toolCallId);
    return texts === undefined ? own : withNotices(own, texts);
  };
  return { ...tool, execute: guardedExecute as Execute, toModelOutput } as Tool;
}

/**
 * Publish the request and act on the decision: throws what the model should read instead of
 * the tool's result. Returns whether the call is watched (its outcome is to be published).
 */
async function admit(name: string, input: unknown, toolCallId: string, run: RunHandle, notices: Map<string, string[]>): Promise<boolean> {
  const failClosed = run.client.failClosed;
  let decision;
  try {
    decision = await run.beforeToolCall(name, input, { toolCallId });
  } catch (err) {
    if (err instanceof LoopBlocked || err instanceof RunAbortedError) {
      run.takeModelNotices(); // the refusal's own message says it all
      if (err instanceof LoopBlocked && ABORT_DETECTORS.has(err.detector ?? "")) ending.add(run);
      throw err;
    }
    if (err instanceof NoDecisionError || err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError) {
      // Only thrown when failing closed (failing open returns null).
      throw new Error(`Tool call blocked: loopwatch loop protection is unavailable (${err.message}).`);
    }
    if (err instanceof LoopwatchInputError) {
      run.client.logger.warn(`${err.message}; ${name} is ${failClosed ? "blocked" : "not watched"}`);
      if (failClosed) throw new Error(`Tool call blocked: ${err.message}`);
      return false;
    }
    throw err;
  }
  if (decision?.action === "block") {
    if (ABORT_DETECTORS.has(decision.detector ?? "")) ending.add(run);
    throw new LoopBlocked(decision); // a client with raiseOnBlock: false
  }
  const texts = decision?.action === "warn" && decision.notify_model && decision.message ? [decision.message] : [];
  texts.push(...run.takeModelNotices());
  if (texts.length > 0) {
    notices.set(toolCallId, texts);
    if (notices.size > MAX_PENDING_NOTICES) {
      const oldest = notices.keys().next().value;
      if (oldest !== undefined) notices.delete(oldest);
    }
  }
  return true;
}

async function publishOutcome(name: string, input: unknown, outcome: ToolOutcome, toolCallId: string, run: RunHandle): Promise<void> {
  try {
    await run.afterToolCall(name, input, outcome, { toolCallId });
  } catch (err) {
    // The tool ran; its outcome not being recorded must not undo it (failing closed included).
    run.client.logger.warn(`the outcome of ${name} was not published: ${err instanceof Error ? err.message : String(err)}`);
  }
}

async function* streamed(output: AsyncIterable<unknown>, publish: (outcome: ToolOutcome) => Promise<void>): AsyncGenerator<unknown> {
  let last: unknown;
  try {
    for await (const part of output) {
      last = part;
      yield part;
    }
  } catch (err) {
    await publish({ error: err instanceof Error ? err.message : err });
    throw err;
  }
  await publish({ result: last });
}

function isAsyncIterable(value: unknown): value is AsyncIterable<unknown> {
  return typeof value === "object" && value !== null && Symbol.asyncIterator in value;
}

/** The model's view of an output, with loopwatch's notices after it as text parts. */
function withNotices(own: ModelOutput, texts: string[]): ModelOutput {
  const extra = texts.map((text) => ({ type: "text" as const, text }));
  switch (own.type) {
    case "text":
      return { type: "content", value: [{ type: "text", text: own.value }, ...extra] };
    case "json":
      return { type: "content", value: [{ type: "text", text: JSON.stringify(own.value) }, ...extra] };
    case "content":
      return { type: "content", value: [...own.value, ...extra] };
    default:
      return own; // an error output (a tool's own toModelOutput): left as it is
  }
}
