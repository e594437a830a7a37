/**
 * loopwatch for the OpenAI Agents SDK for TypeScript (npm `@openai/agents`): tool guardrails.
 *
 *   const run = client.run({ runId: "run-42", sessionKey: "agent:main:42", agentId: "main" });
 *   const agent = new Agent({ name: "main", model, tools: withLoopwatch([readLog], run) });
 *   const result = await new Runner().run(agent, prompt, { maxTurns: 50 }).finally(() => run.end());
 *
 * The SDK's tool input guardrails can refuse a call, so `withLoopwatch` gives each function tool
 * (copies; hosted tools are left as they are) loopwatch's guardrails, as the Python adapter does:
 *
 * * the input guardrail publishes the request and waits for the decision; a block is
 *   `rejectContent` with loopwatch's message (the model reads it as the tool's result, the run
 *   goes on); an abort is `throwException`, the SDK's tripwire: `run()` rejects with
 *   `ToolInputGuardrailTripwireTriggered`, whose `result.output.outputInfo` is the
 *   `RunAbortedError`;
 * * the first output guardrail publishes the outcome (the output as the tool produced it); the
 *   last appends the warnings loopwatch asks to show (`notify_model`) to the output the model
 *   reads (`rejectContent` with the output's text and the warnings: the only way a guardrail
 *   changes an output).
 *
 * * `loopwatchRunOptions(run)`, given to `run()` (or the `Runner`'s config): a call of a tool the
 *   agent does not have is returned to the model as an error (`toolNotFoundBehavior`) and
 *   published, through `toolErrorFormatter`, as requested and completed with the unknown-tool
 *   error ("Unknown tool: name") the engine's unknown-tool detector reads, as the Python adapter
 *   does; a loopwatch block or abort of it replaces the SDK's message.
 *
 * Only types come from `@openai/agents-core`, so this module loads without it.
 */
import type {
  FunctionTool,
  Tool,
  ToolErrorFormatter,
  ToolNotFoundBehavior,
  ToolGuardrailFunctionOutput,
  ToolInputGuardrailDefinition,
  ToolOutputGuardrailDefinition,
} from "@openai/agents-core";
import type { RunHandle } from "../client.js";
import {
  BrokerAccessError,
  LoopBlocked,
  LoopwatchInputError,
  LoopwatchUnavailable,
  NoDecisionError,
  PostCompactionLoopPersistedError,
  RunAbortedError,
} from "../errors.js";
import type { Decision } from "../verdicts.js";

/**
 * The detectors whose block is the refusal of a call of a run loopwatch has aborted (the
 * engine's `refused_after_abort` names the abort's detector): the abort verdict itself may
 * still be on its way when the block arrives.
 */
const ABORT_DETECTORS = new Set(["compaction_loop_persisted", "critical_block_limit"]);
/** Tool calls whose notices wait for their output (a refused call never takes them). */
const MAX_PENDING = 1_024;

const ALLOW: ToolGuardrailFunctionOutput = { behavior: { type: "allow" } };

function reject(message: string, outputInfo?: unknown): ToolGuardrailFunctionOutput {
  return { behavior: { type: "rejectContent", message }, outputInfo };
}

/** The SDK hands guardrails the model's arguments as a JSON string. */
function parsedArguments(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text; // hashed as the string the model sent
  }
}

function remember(map: Map<string, string[]>, key: string, texts: string[]): void {
  map.set(key, texts);
  if (map.size > MAX_PENDING) {
    const oldest = map.keys().next().value;
    if (oldest !== undefined) map.delete(oldest);
  }
}

/** loopwatch's guardrails for one run: `input` first, `outcome` first, `notices` last. */
export function loopwatchGuardrails(run: RunHandle): {
  input: ToolInputGuardrailDefinition<unknown>;
  outcome: ToolOutputGuardrailDefinition<unknown>;
  notices: ToolOutputGuardrailDefinition<unknown>;
} {
  const pending = new Map<string, string[]>();
  /** Calls whose outcome is to be published (not refused, not unwatched). */
  const watched = new Set<string>();

  const abortOf = (decision: Decision): ToolGuardrailFunctionOutput => ({
    behavior: { type: "throwException" },
    outputInfo:
      run.aborted !== null
        ? RunAbortedError.fromVerdict(run.aborted)
        : new (decision.detector === "compaction_loop_persisted" ? PostCompactionLoopPersistedError : RunAbortedError)(
            decision.message ?? "",
            decision.detector ?? "",
            decision.count ?? 0,
            decision.tool_name,
          ),
  });

  const input: ToolInputGuardrailDefinition<unknown> = {
    type: "tool_input",
    name: "loopwatch",
    run: async ({ toolCall }) => {
      const args = parsedArguments(toolCall.arguments);
      let decision: Decision | null;
      try {
        decision = await run.beforeToolCall(toolCall.name, args, { toolCallId: toolCall.callId });
      } catch (err) {
        if (err instanceof RunAbortedError) {
          run.takeModelNotices();
          return { behavior: { type: "throwException" }, outputInfo: err };
        }
        if (err instanceof LoopBlocked) {
          decision = err.decision;
        } else if (err instanceof NoDecisionError || err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError) {
          // Only thrown when failing closed (failing open returns null).
          return reject(`Tool call blocked: loopwatch loop protection is unavailable (${err.message}).`);
        } else if (err instanceof LoopwatchInputError) {
          const failClosed = run.client.failClosed;
          run.client.logger.warn(`${err.message}; ${toolCall.name} is ${failClosed ? "blocked" : "not watched"}`);
          return failClosed ? reject(`Tool call blocked: ${err.message}`) : ALLOW;
        } else {
          throw err;
        }
      }
      if (decision?.action === "block") {
        run.takeModelNotices(); // the refusal's own message says it all
        if (ABORT_DETECTORS.has(decision.detector ?? "")) return abortOf(decision);
        return reject(decision.message ?? "Tool call blocked by loopwatch.", decision);
      }
      watched.add(toolCall.callId);
      const texts = decision?.action === "warn" && decision.notify_model && decision.message ? [decision.message] : [];
      texts.push(...run.takeModelNotices());
      if (texts.length > 0) remember(pending, toolCall.callId, texts);
      return ALLOW;
    },
  };

  const outcome: ToolOutputGuardrailDefinition<unknown> = {
    type: "tool_output",
    name: "loopwatch",
    run: async ({ toolCall, output }) => {
      if (!watched.delete(toolCall.callId)) return ALLOW;
      try {
        await run.afterToolCall(toolCall.name, parsedArguments(toolCall.arguments), { result: output }, { toolCallId: toolCall.callId });
      } catch (err) {
        // The tool ran; its outcome not being recorded must not undo it (failing closed included).
        run.client.logger.warn(`the outcome of ${toolCall.name} was not published: ${err instanceof Error ? err.message : String(err)}`);
      }
      return ALLOW;
    },
  };

  const notices: ToolOutputGuardrailDefinition<unknown> = {
    type: "tool_output",
    name: "loopwatch-notices",
    run: async ({ toolCall, output }) => {
      const texts = pending.get(toolCall.callId);
      pending.delete(toolCall.callId);
      if (texts === undefined) return ALLOW;
      const own = typeof output === "string" ? output : JSON.stringify(output);
      return reject([own, ...texts].join("\n\n"));
    },
  };
  return { input, outcome, notices };
}

/**
 * `tools` with loopwatch's guardrails on each function tool, for one run: copies, so a tool
 * defined once can serve runs guarded or not.
 */
export function withLoopwatch<TOOLS extends Tool<any>[]>(tools: TOOLS, run: RunHandle): TOOLS {
  const { input, outcome, notices } = loopwatchGuardrails(run);
  return tools.map((tool) => {
    if (tool.type !== "function") return tool;
    const fn = tool as FunctionTool<any, any, any>;
    return {
      ...fn,
      inputGuardrails: [input, ...(fn.inputGuardrails ?? [])],
      outputGuardrails: [outcome, ...(fn.outputGuardrails ?? []), notices],
    };
  }) as TOOLS;
}

/**
 * The run options that publish a call of a tool the agent does not have (the SDK hands over no
 * arguments for it): `runner.run(agent, input, { ...loopwatchRunOptions(run) })`.
 */
export function loopwatchRunOptions(run: RunHandle): { toolNotFoundBehavior: ToolNotFoundBehavior; toolErrorFormatter: ToolErrorFormatter } {
  const toolErrorFormatter: ToolErrorFormatter = async ({ kind, toolName, callId }) => {
    if (kind !== "tool_not_found") return undefined;
    let decision: Decision | null;
    try {
      decision = await run.beforeToolCall(toolName, null, { toolCallId: callId });
    } catch (err) {
      if (err instanceof RunAbortedError) return err.message;
      if (err instanceof LoopBlocked) return err.decision.message ?? "Tool call blocked by loopwatch.";
      if (err instanceof NoDecisionError || err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError) {
        // Only thrown when failing closed; there is nothing to run, so the SDK's message stays.
        return undefined;
      }
      if (err instanceof LoopwatchInputError) {
        run.client.logger.warn(`${err.message}; the call of the unknown tool ${toolName} is not watched`);
        return undefined;
      }
      throw err;
    }
    if (decision?.action === "block") return decision.message ?? "Tool call blocked by loopwatch.";
    try {
      await run.afterToolCall(toolName, null, { error: new Error(`Unknown tool: ${toolName}`) }, { toolCallId: callId });
    } catch (err) {
      run.client.logger.warn(`the outcome of ${toolName} was not published: ${err instanceof Error ? err.message : String(err)}`);
    }
    return undefined;
  };
  return { toolNotFoundBehavior: "return_error_to_model", toolErrorFormatter };
}
