/**
 * Edge hashing: call signatures and outcome hashes (spec §2.2, §2.3, §5), the same rules as
 * `streams/edge/hashing.py` and upstream's `hashToolOutcome` (tool-loop-detection.ts), for
 * both profiles at once: `configurable-final`'s hash, and what profile `latest` adds
 * (openclaw-latest.md §4: envelope ids canonicalised, exec terminal failures, write outcomes
 * and targets, no-progress flags), so a runner never needs to know which profile judges it.
 * Raw arguments and results never leave the runner: only what this module returns is published.
 */
import { digest, isPlainObject, sha256Hex, stableStringify } from "./canonical.js";

/**
 * What a tool call produced: `{ result }` (a `result` of `undefined` means the tool returned
 * nothing) or `{ error }` (the value it threw; an `Error` hashes by its message).
 */
export type ToolOutcome = { result: unknown } | { error: unknown };

/** Profile latest's outcome kinds a runner reports (openclaw-latest.md §3). */
export type OutcomeKind = "terminal-exec-failure" | "write-mutation";

/**
 * What upstream's `recordToolCallOutcome` derives from a result or an error, for both profiles
 * (`streams.edge.hashing.Outcome`); `events.completedFromOutcome` maps each field onto the
 * event.
 */
export interface Outcome {
  /** configurable-final's hash: 64 hex, or `error:` + 64 hex; null when the tool returned nothing or for the loop's own veto. */
  readonly resultHash: string | null;
  readonly unknownToolName: string | null;
  readonly loopVeto: boolean;
  readonly isError: boolean;
  /** latest's hash when it differs from `resultHash` (envelope ids canonicalised, a write that changed nothing). */
  readonly normalizedResultHash: string | null;
  /** `terminal-exec-failure` (an exec that ran and failed) or `write-mutation` (a write that changed its target). */
  readonly outcomeKind: OutcomeKind | null;
  /** Terminal exec failures: the drift-free identity of the failure (§4.2). */
  readonly failureIdentityHash: string | null;
  /** An error, or a write that changed nothing. */
  readonly noProgress: boolean;
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
 * does not, so the runner lists them (as `streams.edge.events` does).
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
    // adding a key, so it drops out of the hash (streams/edge/hashing.py lists it).
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

/** The output the exec rules read: `details.aggregated` trimmed when not blank, else the text. */
function execOutput(details: Record<string, unknown>, text: string): string {
  const aggregated = typeof details.aggregated === "string" ? details.aggregated.trim() : "";
  return aggregated || text;
}

/** The value the exec rule hashes (spec §5.1), or undefined when the rule does not apply. */
function execHashed(details: Record<string, unknown>, text: string): unknown {
  const status = stringOrNull(details.status);
  if (!status) {
    return undefined;
  }
  if (status === "running") {
    return { status, tail: stringOrNull(details.tail) ?? "" };
  }
  if (status === "completed" || status === "failed") {
    return {
      status,
      exitCode: typeof details.exitCode === "number" ? details.exitCode : null,
      timedOut: details.timedOut === true,
      output: execOutput(details, text),
    };
  }
  if (status === "approval-pending" || status === "approval-unavailable") {
    return {
      status,
      reason: stringOrNull(details.reason),
      host: stringOrNull(details.host),
      command: stringOrNull(details.command) ?? "",
      warningText: stringOrNull(details.warningText) ?? "",
    };
  }
  return undefined;
}

// -- profile latest (openclaw-latest.md §4) ----------------------------------------------------

const ENVELOPE_MARKER = "<<<EXTERNAL_UNTRUSTED_CONTENT id=";
/** Upstream's expressions, verbatim (§4.1). */
const ENVELOPE =
  /(<<<EXTERNAL_UNTRUSTED_CONTENT id=(\\*)")([a-f0-9]{16})(\2">>>(?:(?!<<<(?:END_)?EXTERNAL_UNTRUSTED_CONTENT)[\s\S])*<<<END_EXTERNAL_UNTRUSTED_CONTENT id=\2")\3(\2">>>)/g;
const QUOTE_ESCAPES = /(?<!\\)\\*"/g;
const ZERO_ID = "0".repeat(16);

function canonicalEnvelope(match: string, start: string, slashes: string, _id: string, inner: string, end: string): string {
  const k = slashes.length;
  // Only a consistently escaped envelope (k = 2^n - 1 backslashes before every quote, at any
  // depth of JSON string encoding) is rewritten; anything else keeps its ids.
  if ((k & (k + 1)) !== 0) {
    return match;
  }
  for (const quote of inner.matchAll(QUOTE_ESCAPES)) {
    if (quote[0].length % (k + 1) !== 0) {
      return match;
    }
  }
  return start + ZERO_ID + inner + ZERO_ID + end;
}

/**
 * Replace the random ids of well-formed `EXTERNAL_UNTRUSTED_CONTENT` envelopes by sixteen
 * zeros (§4.1), so wrapped results that differ only in their ids hash alike.
 */
export function canonicalizeUntrustedEnvelopes(text: string): string {
  return text.includes(ENVELOPE_MARKER) ? text.replace(ENVELOPE, canonicalEnvelope) : text;
}

/** [configurable-final's digest, latest's digest when it differs]. */
function digests(value: unknown): [string, string | null] {
  const text = stableStringify(value);
  const plain = sha256Hex(text);
  // Every string and key appears in the serialisation and the marker needs no escaping:
  // without it there, the normaliser changes nothing.
  if (!text.includes(ENVELOPE_MARKER)) {
    return [plain, null];
  }
  const normalized = stableStringify(value, canonicalizeUntrustedEnvelopes);
  return [plain, normalized === text ? null : sha256Hex(normalized)];
}

/** The failure identity's masks (§4.2), upstream's expressions verbatim, applied in this order. */
const FAILURE_MASKS = [
  /\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:z|[+-]\d{2}:\d{2})?/giu, // ISO timestamps
  /\d{1,2}:\d{2}:\d{2}(?:\.\d{1,6})?/gu, // clock times
  /\b(?:attempt|retry)\b[\s#:=]*\d+/giu, // attempt/retry counters
  /\b\d+(?:\.\d+)?\s?(?:ns|us|ms|seconds?|minutes?|hours?|s)\b/giu, // durations
  /\b(?:pid|ppid)\b[\s#:=]*\d+/giu, // process ids
];

/** A failing command's output with timestamps, clock times, attempt counters, durations and pids masked as `#`. */
export function failureShape(output: string): string {
  return FAILURE_MASKS.reduce((shaped, mask) => shaped.replace(mask, "#"), output);
}

/** The failure identity of a terminal exec failure (§4.2), else null. */
function terminalFailureIdentity(details: Record<string, unknown>, text: string): string | null {
  const status = details.status;
  const exitCode = details.exitCode;
  if ((status !== "completed" && status !== "failed") || typeof exitCode !== "number" || !Number.isFinite(exitCode)) {
    return null;
  }
  if (exitCode === 0 || details.timedOut === true) {
    return null;
  }
  const output = execOutput(details, text);
  if (!output || output === `(Command exited with code ${exitCode})`) {
    return null;
  }
  return digest({ status, exitCode, timedOut: false, output: failureShape(output) }, canonicalizeUntrustedEnvelopes);
}

/**
 * Profile latest's write target (§4.3): SHA-256 of `{"path": <path>}` for tool `write` whose
 * args are an object with a non-empty string `path`, used verbatim; else null.
 */
export function writeTargetHash(toolName: string, args: unknown): string | null {
  if (toolName !== "write" || typeof args !== "object" || args === null || Array.isArray(args)) {
    return null;
  }
  const path = (args as Record<string, unknown>).path;
  return typeof path === "string" && path !== "" ? sha256Hex(stableStringify({ path })) : null;
}

/** Every write that changed nothing hashes alike under latest, whatever its text says. */
const WRITE_UNCHANGED = digest({ status: "unchanged" });

const NOTHING = {
  unknownToolName: null,
  loopVeto: false,
  isError: false,
  normalizedResultHash: null,
  outcomeKind: null,
  failureIdentityHash: null,
  noProgress: false,
} as const;

function hashed(value: unknown, outcomeKind: OutcomeKind | null = null): Outcome {
  const [resultHash, normalizedResultHash] = digests(value);
  return { ...NOTHING, resultHash, normalizedResultHash, outcomeKind };
}

/**
 * Upstream's `hashToolOutcome`: the rules of spec §2.3 in order, first match wins, with
 * profile latest's additions (openclaw-latest.md §4) computed alongside.
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
    const [plain, normalized] = digests(errorText(error));
    return {
      ...NOTHING,
      resultHash: `error:${plain}`,
      normalizedResultHash: normalized === null ? null : `error:${normalized}`,
      unknownToolName: unknownToolName(error),
      isError: true,
      noProgress: true,
    };
  }
  const result = "result" in outcome ? outcome.result : undefined;
  if (!isPlainObject(result)) {
    return result === undefined ? { ...NOTHING, resultHash: null } : hashed(result);
  }
  const details = isPlainObject(result.details) ? result.details : {};
  const text = textContent(result);
  if (details.status === "blocked" && details.deniedReason === "tool-loop") {
    return { ...NOTHING, resultHash: null, loopVeto: true };
  }
  if (toolName === "exec") {
    const value = execHashed(details, text);
    if (value !== undefined) {
      const identity = terminalFailureIdentity(details, text);
      return { ...hashed(value, identity === null ? null : "terminal-exec-failure"), failureIdentityHash: identity };
    }
  }
  if (toolName === "write") {
    if (details.changed === false) {
      return { ...NOTHING, resultHash: digest({ details, text }), normalizedResultHash: WRITE_UNCHANGED, noProgress: true };
    }
    if (details.changed === true) {
      return hashed({ details, text }, "write-mutation");
    }
  }
  if (toolName === "process" && isPlainObject(args)) {
    const action = args.action;
    if (action === "poll") {
      return hashed({
        action,
        status: details.status,
        exitCode: details.exitCode ?? null,
        exitSignal: details.exitSignal ?? null,
        aggregated: details.aggregated ?? null,
        text,
      });
    }
    if (action === "log") {
      return hashed({
        action,
        status: details.status,
        totalLines: details.totalLines ?? null,
        totalChars: details.totalChars ?? null,
        truncated: details.truncated ?? null,
        exitCode: details.exitCode ?? null,
        exitSignal: details.exitSignal ?? null,
        text,
      });
    }
  }
  if (isSendCall(toolName, args, providerSendTools)) {
    return hashed(stripVolatileSendIds(details));
  }
  return hashed({ details, text });
}


/** SHA-256 of a text (a thought, a message), as the peer profiles read it: raw text never leaves the runner. */
export function textHash(text: string): string {
  return sha256Hex(text);
}

/**
 * Gemini CLI's own key of a tool call (`LoopDetectionService.getToolCallKey`): SHA-256 of
 * `<name>:JSON.stringify(args)`, key order included (profile gemini-cli's `call_key`).
 */
export function geminiCallKey(toolName: string, args: unknown): string {
  return sha256Hex(`${toolName}:${JSON.stringify(args)}`);
}
