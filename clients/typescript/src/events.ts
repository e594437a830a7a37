/**
 * The four `tool-calls` events, built from raw tool calls at the runner's edge: the one
 * place in this package where arguments and results become hashes (as `streams/edge/events.py`
 * is for Python). The wire shape is `schemas/jsonschema/tool-calls.event.v1.json`.
 */
import { LoopwatchInputError } from "./errors.js";
import { TooDeepError } from "./canonical.js";
import type { ContentEdge } from "./geminiContent.js";
import {
  argsHash,
  geminiCallKey,
  hashOutcome,
  isKnownPoll,
  textHash,
  writeTargetHash,
  type Outcome,
  type OutcomeKind,
  type ToolOutcome,
} from "./hashing.js";

/** Records larger than this are dead-lettered by the worker (schemas/events.py). */
export const MAX_EVENT_BYTES = 64 * 1024;
/** Bounds of the schema's string fields, in code points (JSON Schema's maxLength). */
export const LIMITS = {
  id: 512,
  toolName: 256,
  argsHash: 256 + 65,
  unknownToolName: 256,
  reason: 256,
} as const;

/** Who a call belongs to. Without a run id the session key (or id) scopes the state. */
export interface RunFields {
  run_id: string | null;
  session_key: string | null;
  session_id: string | null;
  agent_id: string | null;
}

interface EventBase extends RunFields {
  v: 1;
  event_id: string;
  ts_ms: number;
  /**
   * The publisher's number for the event, strictly increasing within its run (`sequence.ts`);
   * the last field, as in the Python Structs. The client sets it when it publishes.
   */
  seq?: number;
}

// Fields in the order of the Python Structs (schemas/events.py), so that an event encodes to
// the bytes `schemas.encode_event` gives it.

export interface ToolCallRequested extends EventBase {
  type: "tool_call.requested";
  tool_call_id: string | null;
  tool_name: string;
  args_hash: string;
  known_poll: boolean;
  gate: boolean;
  /** Tool `write`: SHA-256 of `{"path": <path>}` (profile latest's write target). */
  target_hash: string | null;
  /** SHA-256 of the model's text with the call (profile openhands); left out when unset. */
  thought_hash?: string;
  /** Gemini CLI's key of the call (profile gemini-cli); left out when unset. */
  call_key?: string;
}

export interface ToolCallCompleted extends EventBase {
  type: "tool_call.completed";
  tool_call_id: string | null;
  tool_name: string;
  args_hash: string;
  result_hash: string | null;
  is_error: boolean;
  unknown_tool_name: string | null;
  loop_veto: boolean;
  // profile latest's outcome fields (hashing.Outcome), always filled
  normalized_result_hash: string | null;
  outcome_kind: OutcomeKind | null;
  failure_identity_hash: string | null;
  no_progress: boolean;
  target_hash: string | null;
}

export interface CompactionRetried extends EventBase {
  type: "compaction.retried";
}

export interface RunEnded extends EventBase {
  type: "run.ended";
  reason: string | null;
}

/** A reply of the model without tool calls, or a user message, as its hash (the peer profiles). */
export interface AgentMessage extends EventBase {
  type: "agent.message";
  source: "agent" | "user";
  text_hash: string;
  /** The reply had no user-visible content (OpenHands then sends its corrective feedback). */
  empty: boolean;
}

/** A chunk of the model's streamed text as Gemini CLI's content loop detector reads it (profile gemini-cli). */
export interface ModelText extends EventBase {
  type: "model.text";
  reset: boolean;
  skipped: boolean;
  truncated: number;
  length: number;
  /** 8 bytes per window, base64 (as msgspec writes bytes). */
  windows: string;
}

export type ToolCallEvent = ToolCallRequested | ToolCallCompleted | CompactionRetried | RunEnded | AgentMessage | ModelText;

export interface EventFields extends RunFields {
  tsMs: number;
}

function base(eventId: string, fields: EventFields): EventBase {
  return {
    v: 1,
    event_id: eventId,
    run_id: fields.run_id,
    session_key: fields.session_key,
    session_id: fields.session_id,
    agent_id: fields.agent_id,
    ts_ms: fields.tsMs,
  };
}

/** Hash with upstream's rules, turning whatever the rules cannot digest into one clear error. */
function hashing<T>(what: string, toolName: string, compute: () => T): T {
  try {
    return compute();
  } catch (err) {
    const reason =
      err instanceof RangeError && /call stack/i.test(err.message) && !(err instanceof TooDeepError)
        ? "the value is nested too deeply to serialise (upstream's stableStringify overflows the stack too)"
        : err instanceof Error
          ? err.message
          : String(err);
    throw new LoopwatchInputError(`cannot hash the ${what} of tool ${JSON.stringify(toolName)}: ${reason}`);
  }
}

export function requestedEvent(
  eventId: string,
  toolName: string,
  args: unknown,
  fields: EventFields & { toolCallId: string | null; gate: boolean; thought?: string | null; geminiKey?: boolean },
): ToolCallRequested {
  const event: ToolCallRequested = {
    type: "tool_call.requested",
    ...base(eventId, fields),
    tool_call_id: fields.toolCallId,
    tool_name: toolName,
    args_hash: hashing("arguments", toolName, () => argsHash(toolName, args)),
    known_poll: isKnownPoll(toolName, args),
    gate: fields.gate,
    target_hash: writeTargetHash(toolName, args),
  };
  // The peer profiles' optional fields, in the Python Struct's order, only when asked for.
  if (fields.thought !== undefined && fields.thought !== null) event.thought_hash = textHash(fields.thought);
  if (fields.geminiKey) event.call_key = geminiCallKey(toolName, args);
  return event;
}

/**
 * A reply of the model without tool calls (`source` "agent"), or a user message ("user"), as
 * its hash. `empty` (by default: a blank reply) as OpenHands classifies an empty reply.
 */
export function agentMessageEvent(
  eventId: string,
  text: string,
  fields: EventFields & { source?: "agent" | "user"; empty?: boolean },
): AgentMessage {
  const source = fields.source ?? "agent";
  return {
    type: "agent.message",
    ...base(eventId, fields),
    source,
    text_hash: textHash(text),
    empty: fields.empty ?? (source === "agent" && PYTHON_BLANK.test(text)),
  };
}

/**
 * A chunk of the model's streamed text as its window hashes: the run's `edge` (one
 * `ContentEdge` per run, told of its tool calls and user prompts) computes them. The text
 * itself is not in the event.
 */
export function modelTextEvent(eventId: string, edge: ContentEdge, text: string, fields: EventFields): ModelText {
  const w = edge.feed(text);
  return {
    type: "model.text",
    ...base(eventId, fields),
    reset: w.reset,
    skipped: w.skipped,
    truncated: w.truncated,
    length: w.length,
    windows: w.windows.toString("base64"),
  };
}

/** Only Python's whitespace (`str.strip`, as OpenHands and `streams/edge/events.py` test a reply), not JavaScript's `trim`. */
const PYTHON_BLANK = /^[\t\n\v\f\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

export function completedEvent(
  eventId: string,
  toolName: string,
  args: unknown,
  outcome: ToolOutcome,
  fields: EventFields & { toolCallId: string | null; providerSendTools?: ReadonlySet<string> },
): ToolCallCompleted {
  const callHash = hashing("arguments", toolName, () => argsHash(toolName, args));
  const hashed = hashing("outcome", toolName, () => hashOutcome(toolName, args, outcome, fields.providerSendTools));
  return completedFromOutcome(eventId, toolName, callHash, hashed, { ...fields, targetHash: writeTargetHash(toolName, args) });
}

/** The one mapping from an `Outcome` to the event's fields. */
export function completedFromOutcome(
  eventId: string,
  toolName: string,
  callHash: string,
  outcome: Outcome,
  fields: EventFields & { toolCallId: string | null; targetHash?: string | null },
): ToolCallCompleted {
  return {
    type: "tool_call.completed",
    ...base(eventId, fields),
    tool_call_id: fields.toolCallId,
    tool_name: toolName,
    args_hash: callHash,
    result_hash: outcome.resultHash,
    is_error: outcome.isError,
    unknown_tool_name: outcome.unknownToolName,
    loop_veto: outcome.loopVeto,
    normalized_result_hash: outcome.normalizedResultHash,
    outcome_kind: outcome.outcomeKind,
    failure_identity_hash: outcome.failureIdentityHash,
    no_progress: outcome.noProgress,
    target_hash: fields.targetHash ?? null,
  };
}

/**
 * The result a vetoed call gets instead of running: upstream's blocked result (spec §3,
 * `streams.edge.events.blocked_result`). A runner completes the call with it at once: it never
 * hashes (`loop_veto`), and under profile latest it records the veto.
 */
export function blockedResult(message: string): { content: { type: "text"; text: string }[]; details: Record<string, string> } {
  return {
    content: [{ type: "text", text: message }],
    details: { status: "blocked", deniedReason: "tool-loop", reason: message },
  };
}

export function compactionEvent(eventId: string, fields: EventFields): CompactionRetried {
  return { type: "compaction.retried", ...base(eventId, fields) };
}

export function runEndedEvent(eventId: string, reason: string | null, fields: EventFields): RunEnded {
  return { type: "run.ended", ...base(eventId, fields), reason };
}

/**
 * The Kafka key to publish an event under (`schemas.keys.record_key`): the run id (trimmed as
 * upstream trims it), else the event's state key, so that every event of a run lands on one
 * partition. The worker dead-letters events keyed otherwise (`key_mismatch`).
 */
export function eventKey(fields: RunFields): string {
  if (!fields.run_id && !fields.session_key && !fields.session_id) {
    throw new LoopwatchInputError("one of run_id, session_key or session_id is required");
  }
  return normalizedRunId(fields) ?? stateKey(fields);
}

/**
 * The worker's state key for a run (`schemas.keys.state_key`), which is also the Kafka key of
 * its verdicts: `run:<run id trimmed>`, else the session's "no run" scope, named as upstream
 * names the session: `session:<session key>|`, or `session:|<session id>` without a key.
 */
export function stateKey(fields: RunFields): string {
  const runId = normalizedRunId(fields);
  if (runId !== null) {
    return `run:${runId}`;
  }
  if (fields.session_key) {
    return `session:${fields.session_key}|`;
  }
  return `session:|${fields.session_id ?? ""}`;
}

/** Upstream's run-id normalisation: trimmed (JavaScript's trim); blank means no run. */
function normalizedRunId(fields: RunFields): string | null {
  return typeof fields.run_id === "string" ? fields.run_id.trim() || null : null;
}

function codePoints(text: string): number {
  let n = 0;
  for (const _ of text) {
    n += 1;
  }
  return n;
}

function checkLength(field: string, value: string | null, max: number, min = 0): void {
  if (value === null) {
    return;
  }
  const n = codePoints(value);
  if (n > max || n < min) {
    throw new LoopwatchInputError(
      `${field} is ${n} characters long; the schema allows ${min > 0 ? `${min} to ` : "at most "}${max}`,
    );
  }
}

/** Refuse what the schema would refuse, so the worker never dead-letters our own events. */
export function checkEvent(event: ToolCallEvent): void {
  checkLength("event_id", event.event_id, LIMITS.id, 1);
  for (const field of ["run_id", "session_key", "session_id", "agent_id"] as const) {
    checkLength(field, event[field], LIMITS.id);
  }
  if (!event.run_id && !event.session_key && !event.session_id) {
    throw new LoopwatchInputError("one of run_id, session_key or session_id is required");
  }
  if (!Number.isSafeInteger(event.ts_ms) || event.ts_ms < 0) {
    throw new LoopwatchInputError(`ts_ms must be a non-negative integer, got ${event.ts_ms}`);
  }
  if (event.seq !== undefined && (!Number.isSafeInteger(event.seq) || event.seq < 0)) {
    throw new LoopwatchInputError(`seq must be a non-negative safe integer, got ${event.seq}`);
  }
  if (event.type === "tool_call.requested" || event.type === "tool_call.completed") {
    checkLength("tool_call_id", event.tool_call_id, LIMITS.id);
    checkLength("tool_name", event.tool_name, LIMITS.toolName);
  }
  if (event.type === "tool_call.completed") {
    checkLength("unknown_tool_name", event.unknown_tool_name, LIMITS.unknownToolName);
  }
  if (event.type === "run.ended") {
    checkLength("reason", event.reason, LIMITS.reason);
  }
}

/** The record value: checked against the schema's bounds, then JSON in UTF-8. */
export function encodeEvent(event: ToolCallEvent): Buffer {
  checkEvent(event);
  const data = Buffer.from(JSON.stringify(event), "utf8");
  if (data.length > MAX_EVENT_BYTES) {
    throw new LoopwatchInputError(`the event is ${data.length} bytes, the limit is ${MAX_EVENT_BYTES}`);
  }
  return data;
}
