/**
 * A stand-in for OpenClaw's plugin API object (`OpenClawPluginApi`, src/plugins/types.ts):
 * records what the plugin registers and lets a test call the hooks as the host would. Only
 * the API object is faked; the plugin's Kafka client is real.
 */
import type {
  HookHandlers,
  OpenClawPluginApi,
  ToolResultMiddleware,
} from "../../src/openclaw/plugin.js";

/** OpenClaw's hook names (PLUGIN_HOOK_NAMES in src/plugins/hook-types.ts, openclaw/openclaw@013ba5dc). */
export const OPENCLAW_HOOK_NAMES = [
  "before_model_resolve", "agent_turn_prepare", "before_prompt_build", "before_agent_start", "before_agent_reply",
  "model_call_started", "model_call_ended", "llm_input", "llm_output", "before_agent_finalize", "agent_end",
  "before_compaction", "after_compaction", "before_reset", "inbound_claim", "message_received", "message_sending",
  "message_sent", "before_tool_call", "after_tool_call", "tool_result_persist", "before_message_write",
  "session_start", "session_end", "subagent_spawning", "subagent_delivery_target", "subagent_spawned",
  "subagent_ended", "gateway_start", "gateway_stop", "heartbeat_prompt_contribution", "cron_changed",
  "before_dispatch", "reply_dispatch", "before_install", "before_agent_run",
] as const;

export interface Registration {
  hookName: string;
  handler: (...args: never[]) => unknown;
  opts?: { priority?: number; timeoutMs?: number };
}

export class FakeOpenClaw implements OpenClawPluginApi {
  readonly hooks: Registration[] = [];
  readonly middleware: { handler: ToolResultMiddleware; options?: { runtimes?: string[] } }[] = [];
  readonly services: { id: string; start: () => unknown; stop?: () => unknown }[] = [];
  readonly logs: { level: string; message: string }[] = [];
  readonly logger = {
    debug: (message: string) => this.logs.push({ level: "debug", message }),
    info: (message: string) => this.logs.push({ level: "info", message }),
    warn: (message: string) => this.logs.push({ level: "warn", message }),
    error: (message: string) => this.logs.push({ level: "error", message }),
  };

  constructor(
    readonly pluginConfig: Record<string, unknown> | undefined,
    readonly registrationMode: string = "full",
  ) {}

  on<K extends keyof HookHandlers>(hookName: K, handler: HookHandlers[K], opts?: { priority?: number; timeoutMs?: number }): void {
    this.hooks.push({ hookName, handler: handler as Registration["handler"], ...(opts ? { opts } : {}) });
  }

  registerService(service: { id: string; start: () => unknown; stop?: () => unknown }): void {
    this.services.push(service);
  }

  registerAgentToolResultMiddleware(handler: ToolResultMiddleware, options?: { runtimes?: string[] }): void {
    this.middleware.push({ handler, ...(options ? { options } : {}) });
  }

  /** Run a hook's handlers as OpenClaw's hook runner does: by descending priority. */
  async emit<K extends keyof HookHandlers>(hookName: K, ...args: Parameters<HookHandlers[K]>): Promise<unknown> {
    const handlers = this.hooks
      .filter((h) => h.hookName === hookName)
      .sort((a, b) => (b.opts?.priority ?? 0) - (a.opts?.priority ?? 0));
    let last: unknown;
    for (const h of handlers) {
      last = await (h.handler as (...a: unknown[]) => unknown)(...args);
    }
    return last;
  }

  /** A tool result passing the tool-result middleware (runtime "openclaw"). */
  async passResult(event: Parameters<ToolResultMiddleware>[0], ctx: Parameters<ToolResultMiddleware>[1]) {
    let result = event.result;
    for (const m of this.middleware) {
      const out = await m.handler({ ...event, result }, ctx);
      if (out) result = out.result;
    }
    return result;
  }

  warnings(): string[] {
    return this.logs.filter((l) => l.level === "warn" || l.level === "error").map((l) => l.message);
  }
}
