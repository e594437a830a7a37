/** What the client throws: loopwatch's decisions, and the client's own refusals. */
import type { Decision, RunAborted } from "./verdicts.js";

/** A tool call was vetoed by a critical loop detection; `message` is for the model. */
export class LoopBlocked extends Error {
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
export class RunAbortedError extends Error {
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
 * loopwatch could not be reached in time (publishing or waiting for the decision) and the
 * client is configured to fail closed.
 */
export class LoopwatchUnavailableError extends Error {
  override name = "LoopwatchUnavailableError";
}

/**
 * The call cannot become a valid event (its arguments cannot be hashed, or a name or id is
 * beyond the schema's bounds). Thrown before anything is published.
 */
export class LoopwatchInputError extends Error {
  override name = "LoopwatchInputError";
}

/**
 * The broker refused this client for good: a wrong password, an untrusted certificate, a
 * SASL mechanism it does not offer, a missing ACL. The message says which, in one line.
 */
export class BrokerAccessError extends LoopwatchUnavailableError {
  override name = "BrokerAccessError";
}
