/**
 * The runner client, as `streams/client` is for Python runners: it hashes at the edge
 * (`events.ts`), publishes `tool-calls` events keyed by run id, and reads `loop-verdicts`.
 *
 * * gate mode: `beforeToolCall` waits for the decision, at most `timeoutMs` counted from the
 *   call (publishing included); without one it fails open (the call runs) unless
 *   `failClosed`. A block throws `LoopBlocked` (or is returned, with `raiseOnBlock: false`).
 * * advisory mode: `beforeToolCall` returns once the event is published; verdicts apply as
 *   they arrive: the next call of an aborted run throws `RunAbortedError`, warnings and
 *   blocks collect on the run.
 *
 * Verdicts are de-duplicated by `verdict_id` (delivery is at least once) and matched to runs
 * by their Kafka key, which is the worker's state key for the run. A blocked call is completed
 * at once with upstream's blocked result (`loop_veto`), as upstream's wrapper records its own
 * veto; `afterToolCall` for it is then a no-op. With `signingKey`, every event is signed with
 * the key of its run's agent (`signing.ts`).
 */
import { randomBytes } from "node:crypto";
import {
  BrokerAccessError,
  LoopBlocked,
  LoopwatchInputError,
  LoopwatchUnavailable,
  NoDecisionError,
  RunAbortedError,
} from "./errors.js";
import {
  agentMessageEvent,
  blockedResult,
  compactionEvent,
  completedEvent,
  encodeEvent,
  eventKey,
  modelTextEvent,
  requestedEvent,
  runEndedEvent,
  stateKey,
  type EventFields,
  type RunFields,
  type ToolCallEvent,
} from "./events.js";
import { ContentEdge } from "./geminiContent.js";
import type { ToolOutcome } from "./hashing.js";
import { describeKafkaError, KafkaTransport, withDeadline, type KafkaSettings, type VerdictRecord } from "./kafka.js";
import { numbered } from "./sequence.js";
import type { SigningKey } from "./signing.js";
import { decodeVerdict, type Decision, type RunAborted, type Verdict } from "./verdicts.js";

export interface Logger {
  warn(message: string): void;
  info?(message: string): void;
}

export interface ClientOptions extends KafkaSettings {
  mode?: "gate" | "advisory";
  /** Gate mode: the most a call waits for its decision, publishing included. Also bounds every publish. */
  timeoutMs?: number;
  /** Refuse (throw `NoDecisionError`) instead of going on when loopwatch cannot answer in time. */
  failClosed?: boolean;
  /** Gate mode: throw `LoopBlocked` on a block (default) or return the decision. */
  raiseOnBlock?: boolean;
  /** Provider-docked channel tools whose results are sends (spec §5.2). */
  providerSendTools?: Iterable<string>;
  toolCallsTopic?: string;
  verdictsTopic?: string;
  /** How long `start()` keeps trying to join and position the verdict reader. */
  startTimeoutMs?: number;
  /**
   * Sign every event (for workers that require signed events): the key of the run's agent.
   * Several keys are for runners serving several agents, one key per agent; a run of an agent
   * without a key is refused (`LoopwatchInputError`).
   */
  signingKey?: SigningKey | readonly SigningKey[];
  logger?: Logger;
}

export interface RunIdentity {
  runId?: string | null;
  sessionKey?: string | null;
  sessionId?: string | null;
  agentId?: string | null;
}

/** Verdict ids remembered for de-duplication (oldest forgotten first). */
const SEEN_VERDICTS = 100_000;
/** Runs whose verdicts the client routes; a runner that never ends its runs does not grow without bound. */
const MAX_RUNS = 10_000;

const consoleLogger: Logger = { warn: (message) => console.warn(`loopwatch: ${message}`) };

type Waiter = { resolve: (decision: Decision) => void };

export class LoopwatchClient {
  readonly mode: "gate" | "advisory";
  readonly timeoutMs: number;
  readonly failClosed: boolean;
  readonly raiseOnBlock: boolean;
  readonly providerSendTools: ReadonlySet<string>;
  readonly logger: Logger;
  /** Verdicts dropped because their id was seen before. */
  duplicatesDropped = 0;

  readonly #transport: KafkaTransport;
  readonly #startTimeoutMs: number;
  readonly #brokers: string;
  /** Signing keys by agent id (none: events go unsigned). */
  readonly #keys = new Map<string, SigningKey>();
  readonly #prefix = randomBytes(6).toString("hex");
  #seq = 0;
  readonly #waiting = new Map<string, Waiter>();
  readonly #seen = new Set<string>();
  readonly #detectionOffWarned = new Set<string | null>();
  readonly #runs = new Map<string, RunHandle>();
  #state: "new" | "starting" | "started" | "stopped" = "new";
  #starting: Promise<void> | null = null;

  constructor(options: ClientOptions) {
    const mode = options.mode ?? "gate";
    if (mode !== "gate" && mode !== "advisory") {
      throw new TypeError("mode is 'gate' or 'advisory'");
    }
    if (!Array.isArray(options.brokers) || options.brokers.length === 0) {
      throw new TypeError("brokers: at least one host:port is required");
    }
    this.mode = mode;
    this.timeoutMs = options.timeoutMs ?? 1_000;
    this.failClosed = options.failClosed ?? false;
    this.raiseOnBlock = options.raiseOnBlock ?? true;
    this.providerSendTools = new Set(options.providerSendTools ?? []);
    this.logger = options.logger ?? consoleLogger;
    this.#startTimeoutMs = options.startTimeoutMs ?? 30_000;
    this.#brokers = options.brokers.join(",");
    const keys = options.signingKey === undefined ? [] : Array.isArray(options.signingKey) ? options.signingKey : [options.signingKey];
    for (const key of keys as readonly SigningKey[]) {
      const other = this.#keys.get(key.agentId);
      if (other !== undefined) {
        throw new TypeError(`signingKey: keys ${other.keyId} and ${key.keyId} are both agent ${JSON.stringify(key.agentId)}'s; give one key per agent`);
      }
      this.#keys.set(key.agentId, key);
    }
    this.#transport = new KafkaTransport(
      options,
      { toolCalls: options.toolCallsTopic ?? "tool-calls", verdicts: options.verdictsTopic ?? "loop-verdicts" },
      (record) => this.#onRecord(record),
    );
  }

  /**
   * Connect, join and position the verdict reader; at most `startTimeoutMs`. Idempotent.
   * Rejects with `LoopwatchUnavailable` when Kafka or the verdicts topic cannot be reached in
   * time, `BrokerAccessError` at once when the broker refuses this client for good
   * (credentials, TLS trust, ACLs), with the reason in one line.
   */
  start(): Promise<void> {
    if (this.#state === "stopped") {
      return Promise.reject(new LoopwatchUnavailable("the client was stopped"));
    }
    if (this.#starting === null) {
      this.#state = "starting";
      this.#starting = withDeadline(
        this.#transport.start(),
        this.#startTimeoutMs,
        () => new LoopwatchUnavailable(`could not reach Kafka and the verdicts topic within ${this.#startTimeoutMs} ms`),
      ).then(
        () => {
          this.#state = "started";
        },
        (err: unknown) => {
          // Allow a later start() to try again.
          this.#starting = null;
          this.#state = "new";
          if (err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError) {
            throw err; // the deadline, or BrokerAccessError's one line
          }
          throw new LoopwatchUnavailable(`cannot start on ${this.#brokers}: ${describeKafkaError(err)}`);
        },
      );
    }
    return this.#starting;
  }

  get started(): boolean {
    return this.#state === "started";
  }

  async stop(): Promise<void> {
    this.#state = "stopped";
    for (const waiter of this.#waiting.values()) {
      waiter.resolve(STOPPED);
    }
    this.#waiting.clear();
    await withDeadline(this.#transport.stop(), 10_000, () => new Error("stopping the Kafka client took over 10 s"));
  }

  /** The handle of one run (the same handle for the same run, until it ends). */
  run(identity: RunIdentity): RunHandle {
    const fields: RunFields = {
      run_id: identity.runId ?? null,
      session_key: identity.sessionKey ?? null,
      session_id: identity.sessionId ?? null,
      agent_id: identity.agentId ?? null,
    };
    eventKey(fields); // refuses a run with no id at all, before anything is published
    if (this.#keys.size > 0 && !this.#keys.has(fields.agent_id ?? "")) {
      const keys = [...this.#keys.values()].map((k) => `${k.keyId} of agent ${JSON.stringify(k.agentId)}`).join(", ");
      throw new LoopwatchInputError(
        `this client signs with key ${keys}; a run of agent ${JSON.stringify(fields.agent_id)} needs that agent's key`,
      );
    }
    const key = stateKey(fields);
    let handle = this.#runs.get(key);
    if (handle === undefined) {
      handle = new RunHandle(this, fields, key);
      this.#runs.set(key, handle);
      if (this.#runs.size > MAX_RUNS) {
        const oldest = this.#runs.keys().next().value;
        if (oldest !== undefined) {
          this.#runs.delete(oldest);
        }
      }
    }
    return handle;
  }

  nextEventId(): string {
    this.#seq += 1;
    return `${this.#prefix}-${this.#seq}`;
  }

  /** @internal Forget a run (it ended). */
  forget(key: string): void {
    this.#runs.delete(key);
  }

  /** @internal Register interest in the decision for `eventId` before publishing it. */
  expectDecision(eventId: string): Promise<Decision> {
    return new Promise((resolve) => this.#waiting.set(eventId, { resolve }));
  }

  /** @internal */
  cancelDecision(eventId: string): void {
    this.#waiting.delete(eventId);
  }

  /**
   * @internal Publish one event within `deadlineMs` (absolute, `Date.now()` clock). Encoding
   * errors (`LoopwatchInputError`) are thrown before anything is sent.
   */
  async publish(event: ToolCallEvent, deadlineMs: number, after: Promise<void>): Promise<void> {
    // Numbered here, where every event passes, in the order of the calls: a run's events are
    // sent in that order (`#tail`), the order the worker compares their `seq` in.
    const value = encodeEvent(numbered(event));
    const key = eventKey(event);
    const headers = this.#keys.get(event.agent_id ?? "")?.headers(value);
    await this.#ensureStarted(deadlineMs);
    const send = after.then(() => this.#transport.send(key, value, headers));
    await withDeadline(send, deadlineMs - Date.now(), () => timeoutError(`publishing ${event.type}`, this.timeoutMs));
  }

  async #ensureStarted(deadlineMs: number): Promise<void> {
    if (this.#state === "started") {
      return;
    }
    if (this.#state === "stopped") {
      throw new LoopwatchUnavailable("the client was stopped");
    }
    if (this.#state === "new" && this.#starting === null) {
      throw new LoopwatchUnavailable("the client is not started (call start() first)");
    }
    await withDeadline(this.start(), deadlineMs - Date.now(), () => timeoutError("connecting", this.timeoutMs));
  }

  #onRecord(record: VerdictRecord): void {
    const verdict = decodeVerdict(record.value);
    if (verdict === null) {
      this.logger.warn(`undecodable verdict at partition ${record.partition} offset ${record.offset}; skipped`);
      return;
    }
    this.dispatch(verdict, record.key);
  }

  /**
   * @internal One warning per agent whose decisions say detection is off: every call is
   * allowed, and nothing else would tell (at most 1,000 agents' lines).
   */
  warnDetectionOff(agentId: string | null): void {
    if (this.#detectionOffWarned.has(agentId) || this.#detectionOffWarned.size >= 1000) {
      return;
    }
    this.#detectionOffWarned.add(agentId);
    this.logger.warn(
      `loopwatch detection is OFF for agent ${agentId ?? "*"}: its calls are allowed without a check ` +
        "(start the worker with --config examples/getting-started.yaml, or set tools.loopDetection.enabled: " +
        "true in its config; loopwatch config check shows it)",
    );
  }

  /** @internal Route one verdict: its waiting call, else its run. Duplicates are dropped by id. */
  dispatch(verdict: Verdict, key: string | null): void {
    if (this.#seen.has(verdict.verdict_id)) {
      this.duplicatesDropped += 1;
      return;
    }
    this.#seen.add(verdict.verdict_id);
    if (this.#seen.size > SEEN_VERDICTS) {
      const oldest = this.#seen.values().next().value;
      if (oldest !== undefined) {
        this.#seen.delete(oldest);
      }
    }
    // The record key is the worker's state key; verdicts carry no session id, so the fields
    // alone cannot name a session-scoped run (the key can).
    const run = this.#runs.get(key ?? stateKey({ ...verdict, session_id: null }));
    if (verdict.type === "loop.run_aborted") {
      run?.applyAbort(verdict);
      return;
    }
    const waiter = this.#waiting.get(verdict.cause_event_id);
    if (waiter !== undefined) {
      this.#waiting.delete(verdict.cause_event_id);
      waiter.resolve(verdict);
    } else {
      run?.applyAdvisory(verdict);
    }
  }
}

/** Resolves the pending decisions of a stopped client (never a real decision). */
const STOPPED = Object.freeze({ type: "loop.decision", verdict_id: "" }) as unknown as Decision;

function timeoutError(what: string, timeoutMs: number): NoDecisionError {
  return new NoDecisionError(`no answer from loopwatch within ${timeoutMs} ms (${what})`);
}

/** One agent run's side of the conversation with loopwatch. */
export class RunHandle {
  readonly fields: RunFields;
  /** The worker's state key of the run, which is also its verdicts' Kafka key. */
  readonly key: string;
  aborted: RunAborted | null = null;
  readonly warnings: Decision[] = [];
  readonly blocked: Decision[] = [];
  /**
   * loopwatch answered this run's calls without checking them: its config runs no detection
   * for the agent (`Decision.detection_off`; warned once per agent and client).
   */
  detectionOff = false;
  /** Messages for the model not yet taken by `takeModelNotices` (advisory verdicts, aborts). */
  readonly #notices: string[] = [];
  readonly #vetoed = new Set<string | null>();
  /** Events of one run are published one after another, in call order. */
  #tail: Promise<void> = Promise.resolve();
  /** Gemini's content tracking of the run's streamed text (`modelText`), once it sends any. */
  #content: ContentEdge | null = null;

  constructor(
    readonly client: LoopwatchClient,
    fields: RunFields,
    key: string,
  ) {
    this.fields = fields;
    this.key = key;
  }

  /** Throw `RunAbortedError` if loopwatch has ended this run. */
  check(): void {
    if (this.aborted !== null) {
      throw RunAbortedError.fromVerdict(this.aborted);
    }
  }

  /** @internal */
  applyAbort(verdict: RunAborted): void {
    if (this.aborted === null) {
      this.#notices.push(verdict.message);
    }
    this.aborted = verdict;
  }

  /** @internal A decision that arrived for no waiting call (advisory mode, or after a timeout). */
  applyAdvisory(decision: Decision): void {
    this.#noteDetectionOff(decision);
    if (decision.action === "warn") {
      this.warnings.push(decision);
    } else if (decision.action === "block") {
      this.blocked.push(decision);
    } else {
      return;
    }
    if (decision.notify_model && decision.message !== null) {
      this.#notices.push(decision.message);
    }
  }

  #noteDetectionOff(decision: Decision): void {
    if (decision.detection_off && !this.detectionOff) {
      this.detectionOff = true;
      this.client.warnDetectionOff(this.fields.agent_id ?? null);
    }
  }

  /**
   * What arrived without a waiting call and should reach the model (advisory warnings and
   * blocks with `notify_model`, and an abort), each message returned once.
   */
  takeModelNotices(): string[] {
    return this.#notices.splice(0, this.#notices.length);
  }

  #eventFields(): EventFields {
    return { ...this.fields, tsMs: Date.now() };
  }

  /** Publish after this run's earlier events; returns once sent (or throws on the deadline). */
  #publish(event: ToolCallEvent, deadlineMs: number): Promise<void> {
    const sent = this.client.publish(event, deadlineMs, this.#tail);
    this.#tail = sent.then(
      () => undefined,
      () => undefined,
    );
    return sent;
  }

  /** What to do when loopwatch did not answer: go on (fail open) or refuse (fail closed). */
  #unavailable(err: unknown, what: string): null {
    if (!(err instanceof NoDecisionError || err instanceof LoopwatchUnavailable || err instanceof BrokerAccessError)) {
      err = new NoDecisionError(`${what}: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (this.client.failClosed) {
      throw err;
    }
    this.client.logger.warn(`${(err as Error).message}; failing open (${what})`);
    return null;
  }

  /**
   * Publish the request; in gate mode wait for the decision. Returns the decision (null when
   * none came in time, or in advisory mode). Throws `LoopBlocked`, `RunAbortedError`,
   * `LoopwatchInputError` (nothing published) or, failing closed, `NoDecisionError` (`LoopwatchUnavailable`
   * or `BrokerAccessError` when the client is not running).
   */
  async beforeToolCall(toolName: string, args: unknown, options: { toolCallId?: string | null } = {}): Promise<Decision | null> {
    const toolCallId = options.toolCallId ?? null;
    if (this.aborted !== null) {
      // Refused here, nothing published: the run is over, so its outcome is not either.
      this.#vetoed.add(toolCallId);
      this.check();
    }
    const client = this.client;
    const deadline = Date.now() + client.timeoutMs;
    const gate = client.mode === "gate";
    this.#content?.toolCall(); // a tool call resets Gemini's content tracking
    const event = requestedEvent(client.nextEventId(), toolName, args, { ...this.#eventFields(), toolCallId, gate });
    if (!gate) {
      try {
        await this.#publish(event, deadline);
      } catch (err) {
        return rethrowInput(err) ?? this.#unavailable(err, `${toolName} request`);
      }
      return null;
    }
    const answer = client.expectDecision(event.event_id);
    let decision: Decision;
    try {
      await this.#publish(event, deadline);
      decision = await withDeadline(answer, deadline - Date.now(), () => timeoutError(`decision for ${toolName}`, client.timeoutMs));
    } catch (err) {
      client.cancelDecision(event.event_id);
      return rethrowInput(err) ?? this.#unavailable(err, `${toolName} request`);
    }
    if (decision === STOPPED) {
      return this.#unavailable(new NoDecisionError("the client was stopped before the decision came"), `${toolName} request`);
    }
    this.#noteDetectionOff(decision);
    if (decision.action === "warn") {
      this.warnings.push(decision);
    } else if (decision.action === "block") {
      this.blocked.push(decision);
      // The vetoed call will not run: complete it now with the blocked result, as upstream's
      // wrapper records its own (profile latest counts it as a veto record; configurable-final
      // ignores it). A later afterToolCall for it is a no-op.
      this.#vetoed.add(toolCallId);
      await this.#completeVetoed(toolName, args, toolCallId, decision.message ?? "");
      if (client.raiseOnBlock) {
        throw new LoopBlocked(decision);
      }
    }
    return decision;
  }

  /** Publish the blocked result of a vetoed call; a failure is logged, the block stands. */
  async #completeVetoed(toolName: string, args: unknown, toolCallId: string | null, message: string): Promise<void> {
    const client = this.client;
    const event = completedEvent(client.nextEventId(), toolName, args, { result: blockedResult(message) }, {
      ...this.#eventFields(),
      toolCallId,
    });
    try {
      await this.#publish(event, Date.now() + client.timeoutMs);
    } catch (err) {
      client.logger.warn(`the veto of ${toolName} was not published: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  /**
   * Publish the outcome: `{ result }` (undefined: the tool returned nothing) or `{ error }`
   * (what it threw). A no-op for a call this run vetoed: it was completed when it was blocked
   * (or, refused because the run was aborted, is not recorded at all).
   */
  async afterToolCall(
    toolName: string,
    args: unknown,
    outcome: ToolOutcome,
    options: { toolCallId?: string | null } = {},
  ): Promise<void> {
    const client = this.client;
    const deadline = Date.now() + client.timeoutMs;
    const toolCallId = options.toolCallId ?? null;
    if (this.#vetoed.delete(toolCallId)) {
      return;
    }
    const event = completedEvent(client.nextEventId(), toolName, args, outcome, {
      ...this.#eventFields(),
      toolCallId,
      providerSendTools: client.providerSendTools,
    });
    try {
      await this.#publish(event, deadline);
    } catch (err) {
      rethrowInput(err) ?? this.#unavailable(err, `${toolName} outcome`);
    }
  }

  /**
   * A message of the agent (or, `source` "user", a user prompt) as its hash: profile openhands'
   * monologue and empty-response rules read it, gemini-cli's a prompt's start. The text stays
   * here. Returns the event's id (its verdicts' cause).
   */
  async agentMessage(text: string, options: { source?: "agent" | "user"; empty?: boolean } = {}): Promise<string> {
    if (options.source === "user") this.#content?.userPrompt();
    const event = agentMessageEvent(this.client.nextEventId(), text, { ...this.#eventFields(), ...options });
    try {
      await this.#publish(event, Date.now() + this.client.timeoutMs);
    } catch (err) {
      rethrowInput(err) ?? this.#unavailable(err, "agent message");
    }
    return event.event_id;
  }

  /**
   * A chunk of the model's streamed text, as window hashes (`ContentEdge`): profile gemini-cli's
   * content loop detector reads it; a detection comes back as a warning (`warnings`, Gemini's
   * feedback for the model: `takeModelNotices`) and the second as the run's abort. The text
   * stays here. Returns the event's id (its verdicts' cause).
   */
  async modelText(text: string): Promise<string> {
    this.#content ??= new ContentEdge();
    const event = modelTextEvent(this.client.nextEventId(), this.#content, text, this.#eventFields());
    try {
      await this.#publish(event, Date.now() + this.client.timeoutMs);
    } catch (err) {
      rethrowInput(err) ?? this.#unavailable(err, "model text");
    }
    return event.event_id;
  }

  /** A context compaction followed by a retry: arms the post-compaction guard. */
  async compactionRetried(): Promise<void> {
    const event = compactionEvent(this.client.nextEventId(), this.#eventFields());
    try {
      await this.#publish(event, Date.now() + this.client.timeoutMs);
    } catch (err) {
      rethrowInput(err) ?? this.#unavailable(err, "compaction");
    }
  }

  /** The run finished: loopwatch frees its state, and the client stops routing its verdicts. */
  async end(reason: string | null = null): Promise<void> {
    const event = runEndedEvent(this.client.nextEventId(), reason, this.#eventFields());
    try {
      await this.#publish(event, Date.now() + this.client.timeoutMs);
    } catch (err) {
      rethrowInput(err) ?? this.#unavailable(err, "run end");
    } finally {
      this.client.forget(this.key);
    }
  }
}

/** Input errors are the caller's to see whatever the failure policy; others return null. */
function rethrowInput(err: unknown): null {
  if (err instanceof LoopwatchInputError) {
    throw err;
  }
  return null;
}
