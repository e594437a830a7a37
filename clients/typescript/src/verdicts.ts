/**
 * Verdicts loopwatch publishes on `loop-verdicts` (`schemas/jsonschema/loop-verdicts.verdict.v1.json`).
 * Keyed by the run's state key; `verdict_id` derives from the causing event, so a redelivery
 * carries the same id and is dropped by it. Under profile latest a `tool_call.completed` can
 * cause a decision too (the write-churn warning upstream attaches to a tool's result); no call
 * waits for it, so the client applies it to its run as an advisory verdict.
 */

interface VerdictBase {
  v: number;
  verdict_id: string;
  cause_event_id: string;
  run_id: string | null;
  session_key: string | null;
  agent_id: string | null;
  ts_ms: number;
}

export interface Decision extends VerdictBase {
  type: "loop.decision";
  tool_call_id: string | null;
  tool_name: string;
  args_hash: string;
  action: "allow" | "warn" | "block";
  level: "warning" | "critical" | null;
  detector: string | null;
  count: number | null;
  message: string | null;
  paired_tool_name: string | null;
  warning_key: string | null;
  warning_emitted: boolean | null;
  /** Whether the runner should show `message` to the model (always for a block). */
  notify_model: boolean;
  /**
   * Profile latest: `argument_churn` when the run is busy cycling argument variants without
   * getting anywhere (on argument-churn, poll and ping-pong warnings).
   */
  liveness_signal: string | null;
  /**
   * The worker's config runs no detection for this agent: the call was allowed unchecked
   * (the client warns once per agent; `RunHandle.detectionOff`). Absent when detection is on,
   * as on the wire.
   */
  detection_off?: true;
}

export interface RunAborted extends VerdictBase {
  type: "loop.run_aborted";
  detector: string;
  count: number;
  tool_name: string;
  message: string;
}

export type Verdict = Decision | RunAborted;

const ACTIONS = new Set(["allow", "warn", "block"]);

function isString(value: unknown): value is string {
  return typeof value === "string";
}

/**
 * Decode one record value, or null when it is not a verdict this client understands (the
 * reader skips such records rather than dying on them).
 */
export function decodeVerdict(data: Uint8Array | string): Verdict | null {
  let value: unknown;
  try {
    value = JSON.parse(typeof data === "string" ? data : Buffer.from(data).toString("utf8"));
  } catch {
    return null;
  }
  if (typeof value !== "object" || value === null) {
    return null;
  }
  const v = value as Record<string, unknown>;
  if (!isString(v.verdict_id) || !isString(v.cause_event_id)) {
    return null;
  }
  const base = {
    v: typeof v.v === "number" ? v.v : 1,
    verdict_id: v.verdict_id,
    cause_event_id: v.cause_event_id,
    run_id: isString(v.run_id) ? v.run_id : null,
    session_key: isString(v.session_key) ? v.session_key : null,
    agent_id: isString(v.agent_id) ? v.agent_id : null,
    ts_ms: typeof v.ts_ms === "number" ? v.ts_ms : 0,
  };
  if (v.type === "loop.decision") {
    if (!isString(v.tool_name) || !isString(v.args_hash) || !isString(v.action) || !ACTIONS.has(v.action)) {
      return null;
    }
    return {
      ...base,
      type: "loop.decision",
      tool_call_id: isString(v.tool_call_id) ? v.tool_call_id : null,
      tool_name: v.tool_name,
      args_hash: v.args_hash,
      action: v.action as Decision["action"],
      level: v.level === "warning" || v.level === "critical" ? v.level : null,
      detector: isString(v.detector) ? v.detector : null,
      count: typeof v.count === "number" ? v.count : null,
      message: isString(v.message) ? v.message : null,
      paired_tool_name: isString(v.paired_tool_name) ? v.paired_tool_name : null,
      warning_key: isString(v.warning_key) ? v.warning_key : null,
      warning_emitted: typeof v.warning_emitted === "boolean" ? v.warning_emitted : null,
      notify_model: v.notify_model === true,
      liveness_signal: isString(v.liveness_signal) ? v.liveness_signal : null,
      ...(v.detection_off === true ? { detection_off: true as const } : {}),
    };
  }
  if (v.type === "loop.run_aborted") {
    if (!isString(v.detector) || typeof v.count !== "number" || !isString(v.tool_name) || !isString(v.message)) {
      return null;
    }
    return {
      ...base,
      type: "loop.run_aborted",
      detector: v.detector,
      count: v.count,
      tool_name: v.tool_name,
      message: v.message,
    };
  }
  return null;
}
