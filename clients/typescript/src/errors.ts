/**
 * What the client throws: loopwatch's decisions, and the client's own refusals. The names are
 * the Python client's (`streams/client`), for the same failures, and every class derives from
 * `LoopwatchError`, as every Python error derives from `schemas.errors.LoopwatchError`.
 */
import type { Decision, RunAborted } from "./verdicts.js";

/** Base class of every error loopwatch throws: `instanceof LoopwatchError` catches them all. */
export class LoopwatchError extends Error {
  override name = "LoopwatchError";
}

/** A tool call was vetoed by a critical loop detection; `message` is for the model. */
export class LoopBlocked extends LoopwatchError {
  override name = "LoopBlocked";
  readonly detector: string | null;
  readonly count: number | null;
  readonly toolName: string;

  constructor(readonly decision: Decision) {
    super(decision.message ?? `loopwatch blocked ${decision.tool_name}`);
    this.detector = decision.detector ?? null;
    this.count = decision.count ?? null;
    this.toolName = decision.tool_name;
  }
}

/** loopwatch ended the run (base class of the specific abort errors). */
export class RunAbortedError extends LoopwatchError {
  override name = "RunAbortedError";

  constructor(
    message: string,
    readonly detector: string,
    readonly count: number,
    readonly toolName: string,
  ) {
    super(message);
  }

  static fromVerdict(verdict: RunAborted): RunAbortedError {
    const Kind = verdict.detector === "compaction_loop_persisted" ? PostCompactionLoopPersistedError : RunAbortedError;
    return new Kind(verdict.message, verdict.detector, verdict.count, verdict.tool_name);
  }
}

/** Upstream's `PostCompactionLoopPersistedError`: the loop survived a compaction. */
export class PostCompactionLoopPersistedError extends RunAbortedError {
  override name = "PostCompactionLoopPersistedError";
}

/**
 * @deprecated Catch `LoopwatchUnavailable`, `NoDecisionError` or `BrokerAccessError` (or
 * `LoopwatchError`). The old name of those three: they derive from `LoopwatchError`, as in
 * Python, and `instanceof LoopwatchUnavailableError` still holds for each of them (and for
 * anything else it caught). Nothing throws it itself any more.
 */
export class LoopwatchUnavailableError extends LoopwatchError {
  override name = "LoopwatchUnavailableError";

  static override [Symbol.hasInstance](value: unknown): boolean {
    // Only the class itself answers for the three; a subclass keeps the ordinary prototype check.
    const ordinary = Function.prototype[Symbol.hasInstance].call(this, value);
    if (this !== LoopwatchUnavailableError) return ordinary;
    return ordinary || value instanceof LoopwatchUnavailable || value instanceof NoDecisionError || value instanceof BrokerAccessError;
  }
}

/**
 * The client is not running: it could not start (Kafka or the verdicts topic unreachable
 * within `startTimeoutMs`), was never started, or was stopped.
 */
export class LoopwatchUnavailable extends LoopwatchError {
  override name = "LoopwatchUnavailable";
}

/**
 * Failing closed (`failClosed: true`): no answer from loopwatch in time (publishing the event
 * or waiting for the decision), so the call must not run.
 */
export class NoDecisionError extends LoopwatchError {
  override name = "NoDecisionError";
}

/**
 * The broker refused this client for good: a wrong password, an untrusted certificate, a
 * SASL mechanism it does not offer, a missing ACL. The message says which, in one line.
 */
export class BrokerAccessError extends LoopwatchError {
  override name = "BrokerAccessError";
}

/**
 * Configuration that cannot be used: the OpenClaw plugin's config, or a signing key file
 * (`SigningKeyError`, in `signing.ts`). The message says which setting and why, in one line.
 */
export class ConfigError extends LoopwatchError {
  override name = "ConfigError";
}

/**
 * The call cannot become a valid event (its arguments cannot be hashed, or a name or id is
 * beyond the schema's bounds). Thrown before anything is published.
 */
export class LoopwatchInputError extends LoopwatchError {
  override name = "LoopwatchInputError";
}
