/**
 * loopwatch as an OpenClaw plugin, on top of `LoopwatchClient`.
 *
 * * `before_tool_call` publishes the request; in gate mode a block comes back as OpenClaw's
 *   `{ block: true, blockReason }` with loopwatch's message (the model sees it as the tool
 *   result), and so does every call of a run loopwatch aborted.
 * * `after_tool_call` publishes the outcome; for a call loopwatch blocked it does nothing (the
 *   client completed that call with upstream's blocked result when it blocked it).
 * * `after_compaction` publishes `compaction.retried`; `agent_end` publishes `run.ended`.
 * * Warnings with `notify_model` reach the model through tool-result middleware, appended to
 *   the result of the call they concern (advisory verdicts: to the run's next result).
 *
 * Hook names and shapes follow OpenClaw's `src/plugins/hook-types.ts` and
 * `src/agents/agent-tools.before-tool-call.ts` (see README.md for the exact files).
 */
import {
  BrokerAccessError,
  LoopBlocked,
  LoopwatchInputError,
  LoopwatchUnavailable,
  NoDecisionError,
  RunAbortedError,
} from "../errors.js";
import { LoopwatchClient, type ClientOptions, type RunHandle } from "../client.js";
import { isPlainObject } from "../canonical.js";
import { clientOptionsFromConfig } from "./config.js";

// -- the slice of OpenClaw's plugin API this plugin uses (src/plugins/hook-types.ts) ----------

export interface PluginLogger {
  debug?: (message: string) => void;
  info: (message: string) => void;
  warn: (message: string) => void;
  error: (message: string) => void;
}

export interface ToolContext {
  agentId?: string;
  sessionKey?: string;
  sessionId?: string;
  runId?: string;
  toolName: string;
  toolCallId?: string;
}

export interface BeforeToolCallEvent {
  toolName: string;
  params: Record<string, unknown>;
  runId?: string;
  toolCallId?: string;
}

export interface BeforeToolCallResult {
  params?: Record<string, unknown>;
  block?: boolean;
  blockReason?: string;
}

export interface AfterToolCallEvent {
  toolName: string;
  params: Record<string, unknown>;
  runId?: string;
  toolCallId?: string;
  result?: unknown;
  error?: string;
  durationMs?: number;
}

export interface AgentContext {
  runId?: string;
  agentId?: string;
  sessionKey?: string;
  sessionId?: string;
}

export interface AfterCompactionEvent {
  messageCount: number;
  tokenCount?: number;
  compactedCount: number;
  sessionFile?: string;
}

export interface AgentEndEvent {
  runId?: string;
  messages: unknown[];
  success: boolean;
  error?: string;
  durationMs?: number;
}

export interface ToolResultMiddlewareEvent {
  toolCallId: string;
  toolName: string;
  args: Record<string, unknown>;
  isError?: boolean;
  result: { content?: unknown; details?: unknown; [key: string]: unknown };
}

export interface ToolResultMiddlewareContext {
  runtime: string;
  agentId?: string;
  sessionId?: string;
  sessionKey?: string;
  runId?: string;
}

export interface HookHandlers {
  before_tool_call: (event: BeforeToolCallEvent, ctx: ToolContext) => Promise<BeforeToolCallResult | void>;
  after_tool_call: (event: AfterToolCallEvent, ctx: ToolContext) => Promise<void>;
  after_compaction: (event: AfterCompactionEvent, ctx: AgentContext) => Promise<void>;
  agent_end: (event: AgentEndEvent, ctx: AgentContext) => Promise<void>;
}

export type ToolResultMiddleware = (
  event: ToolResultMiddlewareEvent,
  ctx: ToolResultMiddlewareContext,
) => Promise<{ result: ToolResultMiddlewareEvent["result"] } | void>;

export interface OpenClawPluginApi {
  registrationMode?: string;
  pluginConfig?: Record<string, unknown>;
  logger: PluginLogger;
  on<K extends keyof HookHandlers>(hookName: K, handler: HookHandlers[K], opts?: { priority?: number; timeoutMs?: number }): void;
  registerService?(service: { id: string; start: () => Promise<void> | void; stop?: () => Promise<void> | void }): void;
  registerAgentToolResultMiddleware?(handler: ToolResultMiddleware, options?: { runtimes?: string[] }): void;
}

// ---------------------------------------------------------------------------------------------

/** Runs first among before_tool_call hooks, as upstream's built-in loop detection does. */
export const BEFORE_TOOL_CALL_PRIORITY = 1_000;
/** A failed start is retried by the next hook at most this often. */
const RESTART_INTERVAL_MS = 5_000;
/** Tool calls whose model notices are kept until their result passes the middleware. */
const MAX_PENDING_NOTICES = 1_024;

export interface LoopwatchPlugin {
  client: LoopwatchClient;
  /** Stop the Kafka client (the service's stop does the same). */
  stop(): Promise<void>;
}

function identity(ids: { runId?: string; sessionKey?: string; sessionId?: string; agentId?: string }) {
  return {
    runId: ids.runId ?? null,
    sessionKey: ids.sessionKey ?? null,
    sessionId: ids.sessionId ?? null,
    agentId: ids.agentId ?? null,
  };
}

function textBlock(text: string) {
  return { type: "text", text };
}

/**
 * The content we appended to a result for the model is not the tool's output: drop it again
 * before hashing, or every warned call would look like progress and break the streak.
 */
function withoutAppended(result: unknown, appended: readonly string[] | undefined): unknown {
  if (!appended || appended.length === 0 || !isPlainObject(result) || !Array.isArray(result.content)) {
    return result;
  }
  const content = result.content;
  const tail = content.slice(content.length - appended.length);
  const ours = tail.every(
    (entry, i) => isPlainObject(entry) && entry.type === "text" && entry.text === appended[i],
  );
  return ours ? { ...result, content: content.slice(0, content.length - appended.length) } : result;
}

/** Register the hooks on `api`; returns the client (for the host's shutdown and for tests). */
export function registerLoopwatch(api: OpenClawPluginApi, options?: ClientOptions): LoopwatchPlugin {
  const log = api.logger;
  const clientOptions = options ?? clientOptionsFromConfig(api.pluginConfig);
  const client = new LoopwatchClient({
    ...clientOptions,
    logger: { warn: (message) => log.warn(`loopwatch: ${message}`), info: (message) => log.info(`loopwatch: ${message}`) },
  });
  const failClosed = client.failClosed;
  let lastStart = -Infinity;
  let stopped = false;

  function ensureStarting(): void {
    if (stopped || client.started || Date.now() - lastStart < RESTART_INTERVAL_MS) {
      return;
    }
    lastStart = Date.now();
    client.start().then(
      () => log.info("loopwatch: connected"),
      (err: unknown) => log.warn(`loopwatch: cannot connect yet: ${err instanceof Error ? err.message : String(err)}`),
    );
  }

  /** Model notices of gate-mode warnings, by run and tool call, until the result middleware takes them. */
  const pending = new Map<string, string[]>();
  /** What the middleware appended, by run and tool call, for after_tool_call to take out again. */
  const appended = new Map<string, string[]>();
  const callKey = (run: RunHandle, toolCallId: string) => `${run.key}\u0000${toolCallId}`;
  function remember(map: Map<string, string[]>, key: string, texts: string[]): void {
    map.set(key, texts);
    if (map.size > MAX_PENDING_NOTICES) {
      const oldest = map.keys().next().value;
      if (oldest !== undefined) {
        map.delete(oldest);
      }
    }
  }

  /** Agents whose runs the client refuses (a signing client without their key), each logged once. */
  const refusedAgents = new Set<string | null>();

  /**
   * The run of a hook's ids; null when nothing scopes the call (upstream does not detect loops
   * without a session either), the client's refusal when it cannot publish for the run's agent.
   */
  function runFor(ids: { runId?: string; sessionKey?: string; sessionId?: string; agentId?: string }): RunHandle | LoopwatchInputError | null {
    if (!ids.runId && !ids.sessionKey && !ids.sessionId) {
      return null;
    }
    ensureStarting();
    try {
      return client.run(identity(ids));
    } catch (err) {
      if (!(err instanceof LoopwatchInputError)) {
        throw err;
      }
      if (!refusedAgents.has(ids.agentId ?? null) && refusedAgents.size < MAX_PENDING_NOTICES) {
        refusedAgents.add(ids.agentId ?? null);
        log.warn(`loopwatch: ${err.message}; this agent's tool calls are ${failClosed ? "blocked" : "not watched"}`);
      }
      return err;
    }
  }

  const beforeToolCall: HookHandlers["before_tool_call"] = async (event, ctx) => {
    const run = runFor({ ...ctx, runId: event.runId ?? ctx.runId });
    if (run === null) {
      return;
    }
    if (run instanceof LoopwatchInputError) {
      return failClosed ? { block: true, blockReason: `Tool call blocked: ${run.message}` } : undefined;
    }
    const toolCallId = event.toolCallId ?? ctx.toolCallId ?? null;
    try {
      const decision = await run.beforeToolCall(event.toolName, event.params, { toolCallId });
      if (decision?.action === "warn") {
        log.warn(`loopwatch: ${decision.message ?? `loop warning for ${event.toolName}`}`);
        if (decision.notify_model && decision.message && toolCallId !== null) {
          remember(pending, callKey(run, toolCallId), [decision.message]);
        }
      }
      return;
    } catch (err) {
      if (err instanceof RunAbortedError) {
        run.takeModelNotices(); // the block reason carries the abort; do not append it again
        return { block: true, blockReason: err.message };
      }
      if (err instanceof LoopBlocked) {
        return { block: true, blockReason: err.message };
      }
      if (err instanceof NoDecisionError || err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError) {
        // Only thrown when failing closed (failing open returns null above).
        return { block: true, blockReason: `Tool call blocked: loopwatch loop protection is unavailable (${err.message}).` };
      }
      const reason = err instanceof LoopwatchInputError ? err.message : `unexpected error: ${String(err)}`;
      log.warn(`loopwatch: ${reason}`);
      return failClosed ? { block: true, blockReason: `Tool call blocked: ${reason}` } : undefined;
    }
  };

  const afterToolCall: HookHandlers["after_tool_call"] = async (event, ctx) => {
    const run = runFor({ ...ctx, runId: event.runId ?? ctx.runId });
    if (run === null || run instanceof LoopwatchInputError) {
      return;
    }
    const toolCallId = event.toolCallId ?? ctx.toolCallId ?? null;
    let ours: string[] | undefined;
    if (toolCallId !== null) {
      ours = appended.get(callKey(run, toolCallId));
      appended.delete(callKey(run, toolCallId));
      pending.delete(callKey(run, toolCallId));
    }
    // OpenClaw passes a thrown error as its message (a string); a result otherwise.
    const outcome =
      typeof event.error === "string" && event.error !== ""
        ? { error: event.error }
        : { result: withoutAppended(event.result, ours) };
    try {
      await run.afterToolCall(event.toolName, event.params, outcome, { toolCallId });
    } catch (err) {
      log.warn(`loopwatch: outcome of ${event.toolName} not published: ${err instanceof Error ? err.message : String(err)}`);
    }
  };

  const afterCompaction: HookHandlers["after_compaction"] = async (_event, ctx) => {
    const run = runFor(ctx);
    if (run === null || run instanceof LoopwatchInputError) {
      return;
    }
    try {
      await run.compactionRetried();
    } catch (err) {
      log.warn(`loopwatch: compaction not published: ${err instanceof Error ? err.message : String(err)}`);
    }
  };

  const agentEnd: HookHandlers["agent_end"] = async (event, ctx) => {
    const run = runFor({ ...ctx, runId: event.runId ?? ctx.runId });
    if (run === null || run instanceof LoopwatchInputError) {
      return;
    }
    try {
      await run.end(event.success ? "completed" : "failed");
    } catch (err) {
      log.warn(`loopwatch: run end not published: ${err instanceof Error ? err.message : String(err)}`);
    }
  };

  const toolResultMiddleware: ToolResultMiddleware = async (event, ctx) => {
    const run = runFor(ctx);
    if (run === null || run instanceof LoopwatchInputError) {
      return;
    }
    const key = callKey(run, event.toolCallId);
    const notices = [...(pending.get(key) ?? []), ...run.takeModelNotices()];
    pending.delete(key);
    if (notices.length === 0) {
      return;
    }
    remember(appended, key, notices);
    const content = Array.isArray(event.result.content) ? event.result.content : [];
    return { result: { ...event.result, content: [...content, ...notices.map(textBlock)] } };
  };

  api.on("before_tool_call", beforeToolCall, { priority: BEFORE_TOOL_CALL_PRIORITY });
  api.on("after_tool_call", afterToolCall);
  api.on("after_compaction", afterCompaction);
  api.on("agent_end", agentEnd);
  if (typeof api.registerAgentToolResultMiddleware === "function") {
    api.registerAgentToolResultMiddleware(toolResultMiddleware, { runtimes: ["openclaw"] });
  } else {
    log.warn("loopwatch: this OpenClaw has no tool-result middleware; warnings cannot reach the model (they are logged)");
  }

  const stop = async () => {
    stopped = true;
    await client.stop();
  };
  if (typeof api.registerService === "function") {
    api.registerService({ id: "loopwatch-client", start: () => ensureStarting(), stop });
  }
  if (api.registrationMode === undefined || api.registrationMode === "full") {
    ensureStarting();
  }
  return { client, stop };
}
