/**
 * Edge hashing: call signatures and outcome hashes (spec §2.2, §2.3, §5), the same rules as
 * `streams/hashing.py` and upstream's `hashToolOutcome` (tool-loop-detection.ts at the
 * `configurable-final` profile). Raw arguments and results never leave the runner: only
 * what this module returns is published.
 */
import { digest, isPlainObject, stableStringify } from "./canonical.js";

/**
 * What a tool call produced: `{ result }` (a `result` of `undefined` means the tool returned
 * nothing) or `{ error }` (the value it threw; an `Error` hashes by its message).
 */
export type ToolOutcome = { result: unknown } | { error: unknown };

/**
 * What upstream's `recordToolCallOutcome` derives from a result or an error. Later profiles
 * add fields here (issue 14); `events.completedEvent` maps each one onto the event.
 */
export interface Outcome {
  /** 64 hex, or `error:` + 64 hex; null when the tool returned nothing or for the loop's own veto. */
  readonly resultHash: string | null;
  readonly unknownToolName: string | null;
  readonly loopVeto: boolean;
  readonly isError: boolean;
}

/** The call signature `<tool>:<sha256 of canonical args>`; args are hashed as received. */
export function argsHash(toolName: string, args: unknown): string {
  return `${toolName}:${digest(args)}`;
}

/** `command_status` (any args) and `process` with action poll/log (spec §2.8). */
export function isKnownPoll(toolName: string, args: unknown): boolean {
  if (toolName === "command_status") {
    return true;
  }
  if (toolName !== "process" || !isPlainObject(args)) {
    return false;
  }
  return args.action === "poll" || args.action === "log";
}

const SEND_LIKE_MESSAGE_ACTIONS = new Set([
  "send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment",
  "upload-file", "sticker", "poll",
]);

const VOLATILE_SEND_KEYS = new Set([
  "messageId", "message_id", "messageIds", "platformMessageId", "platformMessageIds",
  "fileId", "file_id", "fileKey", "pollId", "poll_id", "receipt", "runId",
  "idempotencyKey", "ts", "timestamp", "sentAt", "deliveredAt", "createdAt",
]);

/**
 * Whether a call is an outbound send whose result carries volatile ids (spec §5.2).
 * `providerSendTools` names the provider-docked channel tools (telegram, discord, …) that
 * count as sends: upstream asks the channel plugin, which the runner knows and loopwatch
 * does not, so the runner lists them (as `streams.edge` does).
 */
export function isSendCall(toolName: string, args: unknown, providerSendTools: ReadonlySet<string>): boolean {
  if (toolName === "sessions_send") {
    return true;
  }
  if (toolName === "message") {
    const action = isPlainObject(args) ? args.action : undefined;
    return typeof action === "string" && SEND_LIKE_MESSAGE_ACTIONS.has(action);
  }
  return providerSendTools.has(toolName);
}

function isMessageDeliveryObject(value: Record<string, unknown>): boolean {
  return (
    typeof value.id === "string" &&
    typeof value.text === "string" &&
    (typeof value.direction === "string" ||
      typeof value.senderId === "string" ||
      typeof value.accountId === "string" ||
      isPlainObject(value.conversation))
  );
}

/** Drop per-send volatile ids and timestamps, at any depth (spec §5.2). */
export function stripVolatileSendIds(value: unknown): unknown {
  if (Array.isArray(value)) {
    return value.map(stripVolatileSendIds);
  }
  if (!isPlainObject(value)) {
    return value;
  }
  const dropId = isMessageDeliveryObject(value);
  const stripped: Record<string, unknown> = {};
  for (const [key, nested] of Object.entries(value)) {
    if (VOLATILE_SEND_KEYS.has(key) || (key === "id" && dropId)) {
      continue;
    }
    // Plain assignment, as upstream: a `__proto__` key sets the copy's prototype instead of
    // adding a key, so it drops out of the hash (streams/hashing.py lists it).
    stripped[key] = stripVolatileSendIds(nested);
  }
  return stripped;
}

function errorText(error: unknown): string {
  if (error instanceof Error) {
    return error.message || error.name;
  }
  if (typeof error === "string") {
    return error;
  }
  if (typeof error === "number" || typeof error === "boolean" || typeof error === "bigint") {
    return `${error}`;
  }
  return stableStringify(error);
}

const UNKNOWN_TOOL_PATTERNS = [
  /unknown tool[:\s]+["']?([a-z0-9_.-]+)["']?/i,
  /tool\s+["']?([a-z0-9_.-]+)["']?\s+(?:not found|is not available)/i,
];

/** The missing tool's name from an "unknown tool"-style error, lowercased (spec §2.9). */
export function unknownToolName(error: unknown): string | null {
  const raw = errorText(error).trim();
  if (!raw) {
    return null;
  }
  for (const pattern of UNKNOWN_TOOL_PATTERNS) {
    const name = raw.match(pattern)?.[1]?.trim();
    if (name) {
      return name.toLowerCase();
    }
  }
  return null;
}

function textContent(result: Record<string, unknown>): string {
  if (!Array.isArray(result.content)) {
    return "";
  }
  return result.content
    .filter(
      (entry): entry is { type: string; text: string } =>
        isPlainObject(entry) && typeof entry.type === "string" && typeof entry.text === "string",
    )
    .map((entry) => entry.text)
    .join("\n")
    .trim();
}

function stringOrNull(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

function execOutcomeHash(details: Record<string, unknown>, text: string): string | null {
  const status = stringOrNull(details.status);
  if (!status) {
    return null;
  }
  if (status === "running") {
    return digest({ status, tail: stringOrNull(details.tail) ?? "" });
  }
  if (status === "completed" || status === "failed") {
    const aggregated = typeof details.aggregated === "string" ? details.aggregated.trim() : "";
    return digest({
      status,
      exitCode: typeof details.exitCode === "number" ? details.exitCode : null,
      timedOut: details.timedOut === true,
      output: aggregated || text,
    });
  }
  if (status === "approval-pending" || status === "approval-unavailable") {
    return digest({
      status,
      reason: stringOrNull(details.reason),
      host: stringOrNull(details.host),
      command: stringOrNull(details.command) ?? "",
      warningText: stringOrNull(details.warningText) ?? "",
    });
  }
  return null;
}

function hashOnly(resultHash: string | null): Outcome {
  return { resultHash, unknownToolName: null, loopVeto: false, isError: false };
}

/**
 * Upstream's `hashToolOutcome`: the rules of spec §2.3 in order, first match wins.
 * `providerSendTools`: the provider-docked send tools (see `isSendCall`).
 */
export function hashOutcome(
  toolName: string,
  args: unknown,
  outcome: ToolOutcome,
  providerSendTools: ReadonlySet<string> = new Set(),
): Outcome {
  const error = "error" in outcome ? outcome.error : undefined;
  if (error !== undefined) {
    return {
      resultHash: `error:${digest(errorText(error))}`,
      unknownToolName: unknownToolName(error),
      loopVeto: false,
      isError: true,
    };
  }
  const result = "result" in outcome ? outcome.result : undefined;
  if (!isPlainObject(result)) {
    return hashOnly(result === undefined ? null : digest(result));
  }
  const details = isPlainObject(result.details) ? result.details : {};
  const text = textContent(result);
  if (details.status === "blocked" && details.deniedReason === "tool-loop") {
    return { resultHash: null, unknownToolName: null, loopVeto: true, isError: false };
  }
  if (toolName === "exec") {
    const execHash = execOutcomeHash(details, text);
    if (execHash !== null) {
      return hashOnly(execHash);
    }
  }
  if (toolName === "process" && isPlainObject(args)) {
    const action = args.action;
    if (action === "poll") {
      return hashOnly(digest({
        action,
        status: details.status,
        exitCode: details.exitCode ?? null,
        exitSignal: details.exitSignal ?? null,
        aggregated: details.aggregated ?? null,
        text,
      }));
    }
    if (action === "log") {
      return hashOnly(digest({
        action,
        status: details.status,
        totalLines: details.totalLines ?? null,
        totalChars: details.totalChars ?? null,
        truncated: details.truncated ?? null,
        exitCode: details.exitCode ?? null,
        exitSignal: details.exitSignal ?? null,
        text,
      }));
    }
  }
  if (isSendCall(toolName, args, providerSendTools)) {
    return hashOnly(digest(stripVolatileSendIds(details)));
  }
  return hashOnly(digest({ details, text }));
}

/** The result loopwatch's clients record for a call they vetoed: the loop's own block. */
export const LOOP_VETO_RESULT = Object.freeze({
  details: Object.freeze({ status: "blocked", deniedReason: "tool-loop" }),
});
