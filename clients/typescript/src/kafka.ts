/**
 * The one module that talks to Kafka (through @platformatic/kafka's public API only; why that
 * client is in README.md). It publishes `tool-calls` records and reads `loop-verdicts` from
 * the end of every partition; everything else in the package is Kafka-agnostic.
 *
 * A broker that refuses this client for good (a wrong password, an untrusted certificate, a
 * missing ACL) is told apart from one that is merely unreachable: `start()` fails with
 * `BrokerAccessError` and one line saying why, as `streams/edge/broker.py` does for Python.
 */
import { once } from "node:events";
import { randomUUID } from "node:crypto";
import { BrokerAccessError } from "./errors.js";
import type { ConnectionOptions as TlsOptions } from "node:tls";
import {
  Consumer,
  Producer,
  compatibilityPartitioner,
  type MessagesStream,
  type SASLMechanismValue,
} from "@platformatic/kafka";

export interface SaslSettings {
  mechanism: "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" | "OAUTHBEARER";
  username?: string;
  password?: string;
  /** OAUTHBEARER token. */
  token?: string;
}

export interface KafkaSettings {
  /** Bootstrap servers, `host:port`. */
  brokers: string[];
  clientId?: string;
  /** TLS: `true` for Node's defaults (system CAs), or Node `tls.connect` options (ca, cert, key, servername, …). */
  tls?: boolean | TlsOptions;
  sasl?: SaslSettings;
  /** Time to open one connection (ms). */
  connectTimeoutMs?: number;
  /** Time for one request once connected (ms). */
  requestTimeoutMs?: number;
  /**
   * The verdict reader's consumer group is this prefix and a random id. The default fits the
   * runner ACLs of README "Securing Kafka" (groups `runner-*`).
   */
  groupIdPrefix?: string;
}

export const DEFAULT_GROUP_ID_PREFIX = "runner-loopwatch-";

export interface VerdictRecord {
  key: string | null;
  value: Buffer;
  partition: number;
  offset: bigint;
}

export interface Topics {
  toolCalls: string;
  verdicts: string;
}

type Bytes = Producer<Buffer, Buffer, Buffer, Buffer>;
type Reader = Consumer<Buffer, Buffer, Buffer, Buffer>;

/** Reject with `onTimeout()` unless `work` settles within `ms`; the timer never outlives it. */
export async function withDeadline<T>(work: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(onTimeout()), Math.max(0, ms));
  });
  try {
    return await Promise.race([work, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Node's codes for a certificate chain it does not trust. */
const UNTRUSTED_CERTIFICATE = new Set([
  "SELF_SIGNED_CERT_IN_CHAIN", "DEPTH_ZERO_SELF_SIGNED_CERT", "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "CERT_UNTRUSTED", "CERT_HAS_EXPIRED", "CERT_NOT_YET_VALID", "CERT_SIGNATURE_FAILURE",
  "CERT_REVOKED", "ERR_TLS_CERT_ALTNAME_INVALID",
]);

interface KafkaErrorLike {
  message?: string;
  code?: string;
  apiId?: string;
  errors?: unknown[];
  cause?: unknown;
}

/**
 * Every error in a library error's tree, outermost first: the library nests the cause of a
 * failed connection (a Node TLS error with its `code`, a broker's error with its `apiId`) in
 * `errors` and `cause`, the tree its own `findBy` searches.
 */
function errorTree(error: unknown, out: KafkaErrorLike[] = [], depth = 0): KafkaErrorLike[] {
  if (typeof error !== "object" || error === null || depth > 8) {
    return out;
  }
  const e = error as KafkaErrorLike;
  out.push(e);
  for (const inner of Array.isArray(e.errors) ? e.errors : []) {
    errorTree(inner, out, depth + 1);
  }
  errorTree(e.cause, out, depth + 1);
  return out;
}

/**
 * One line saying why connecting failed for good, prefixed with the broker's address; null
 * when the failure may pass (refused connection, timeouts, a broker still starting).
 */
export function explainAccess(error: unknown, settings: KafkaSettings): string | null {
  const tree = errorTree(error);
  const where = tree.map((e) => /Connection to (\S+) failed/.exec(e.message ?? "")?.[1]).find(Boolean) ?? settings.brokers.join(",");
  const sasl = settings.sasl;
  for (const e of tree) {
    if (e.code !== undefined && UNTRUSTED_CERTIFICATE.has(e.code)) {
      return `${where}: TLS: the broker's certificate is not trusted (${e.message}); is the CA file the one that signed the brokers' certificates?`;
    }
    if (e.apiId === "SASL_AUTHENTICATION_FAILED") {
      const how = sasl === undefined ? "SASL" : `SASL ${sasl.mechanism}`;
      const who = sasl?.username !== undefined ? ` as '${sasl.username}'` : "";
      return `${where}: ${how} authentication${who} refused: wrong username or password`;
    }
    if (e.apiId === "UNSUPPORTED_SASL_MECHANISM") {
      return `${where}: the broker does not offer SASL mechanism ${sasl?.mechanism}`;
    }
    if (e.apiId !== undefined && e.apiId.endsWith("_AUTHORIZATION_FAILED")) {
      return `${where}: not authorized (${e.apiId}); the runner's principal needs the ACLs of README "Securing Kafka" (groupIdPrefix names the consumer group)`;
    }
  }
  return null;
}

/** The innermost messages of a library error, in one line. */
export function describeKafkaError(error: unknown): string {
  const leaves = errorTree(error).filter((e) => !Array.isArray(e.errors) && e.cause === undefined);
  const messages = [...new Set(leaves.map((e) => [e.message, e.apiId].filter(Boolean).join(" ")).filter(Boolean))];
  return messages.join("; ") || String(error);
}

function connectionOptions(settings: KafkaSettings) {
  const tls = settings.tls === true ? {} : settings.tls || undefined;
  return {
    clientId: settings.clientId ?? "loopwatch-client",
    bootstrapBrokers: settings.brokers,
    connectTimeout: settings.connectTimeoutMs ?? 5_000,
    timeout: settings.requestTimeoutMs ?? 5_000,
    ...(tls ? { tls } : {}),
    ...(settings.sasl
      ? {
          sasl: {
            mechanism: settings.sasl.mechanism as SASLMechanismValue,
            ...(settings.sasl.username !== undefined ? { username: settings.sasl.username } : {}),
            ...(settings.sasl.password !== undefined ? { password: settings.sasl.password } : {}),
            ...(settings.sasl.token !== undefined ? { token: settings.sasl.token } : {}),
          },
        }
      : {}),
  };
}

export class KafkaTransport {
  readonly #producer: Bytes;
  readonly #consumer: Reader;
  readonly #topics: Topics;
  readonly #settings: KafkaSettings;
  #stream: MessagesStream<Buffer, Buffer, Buffer, Buffer> | null = null;
  #probe: Bytes | null = null;
  #stopped = false;

  constructor(settings: KafkaSettings, topics: Topics, private readonly onRecord: (record: VerdictRecord) => void) {
    const common = connectionOptions(settings);
    this.#topics = topics;
    this.#settings = settings;
    // Java's partitioner (murmur2 & 0x7fffffff): the same partition as the Python client and
    // aiokafka give a run id, so every runner's events of one run meet in one worker.
    this.#producer = new Producer({ ...common, partitioner: compatibilityPartitioner, autocreateTopics: false });
    // A group of its own (one member, every partition) read from the end: the client wants
    // the verdicts of its own requests from now on and never commits.
    this.#consumer = new Consumer({
      ...common,
      groupId: `${settings.groupIdPrefix ?? DEFAULT_GROUP_ID_PREFIX}${randomUUID()}`,
      autocommit: false,
      sessionTimeout: 30_000,
      heartbeatInterval: 3_000,
    });
  }

  /**
   * Join, and position every verdict partition at its current end before returning, so no
   * verdict for a request published afterwards can be missed.
   */
  async start(): Promise<void> {
    await this.#probeAccess();
    if (this.#stopped) {
      throw new Error("the client was stopped while starting");
    }
    let stream: MessagesStream<Buffer, Buffer, Buffer, Buffer>;
    try {
      stream = await this.#consumer.consume({
        topics: [this.#topics.verdicts],
        mode: "latest",
        autocommit: false,
        maxWaitTime: 500,
      });
    } catch (err) {
      throw this.#accessError(err) ?? err;
    }
    this.#stream = stream;
    stream.on("data", (message) => {
      this.onRecord({
        key: message.key && message.key.length > 0 ? message.key.toString("utf8") : null,
        value: message.value,
        partition: message.partition,
        offset: message.offset,
      });
    });
    stream.on("error", () => {
      // A broken stream is the broker going away; requests then time out and fail open or
      // closed as configured. Swallowed here so it never becomes an unhandled 'error'.
    });
    await once(stream, "offsets");
    // The producer's first send would fetch metadata anyway; doing it now makes start()
    // fail for a missing tool-calls topic instead of the first call.
    await this.#producer.metadata({ topics: [this.#topics.toolCalls] });
  }

  /**
   * One metadata request without the library's retries: a refused password or an untrusted
   * certificate shows at once (the consumer's join would retry for seconds first). Anything
   * else is left to the join, which keeps trying until `start()`'s deadline.
   */
  async #probeAccess(): Promise<void> {
    const probe: Bytes = new Producer({ ...connectionOptions(this.#settings), retries: 0, autocreateTopics: false });
    this.#probe = probe;
    try {
      await probe.metadata({ topics: [this.#topics.toolCalls] });
    } catch (err) {
      const refused = this.#accessError(err);
      if (refused !== null) {
        throw refused;
      }
    } finally {
      this.#probe = null;
      await probe.close().catch(() => undefined);
    }
  }

  #accessError(error: unknown): BrokerAccessError | null {
    const reason = explainAccess(error, this.#settings);
    return reason === null ? null : new BrokerAccessError(reason);
  }

  async send(key: string, value: Buffer, headers?: readonly [string, string][]): Promise<void> {
    const message = { topic: this.#topics.toolCalls, key: Buffer.from(key, "utf8"), value };
    await this.#producer.send({
      messages: [
        headers === undefined
          ? message
          : { ...message, headers: new Map(headers.map(([name, text]) => [Buffer.from(name, "utf8"), Buffer.from(text, "utf8")])) },
      ],
    });
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    const results = await Promise.allSettled([
      this.#probe ? this.#probe.close() : Promise.resolve(),
      this.#stream ? this.#stream.close() : Promise.resolve(),
      this.#consumer.close(true),
      this.#producer.close(true),
    ]);
    this.#stream = null;
    const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed) {
      throw failed.reason;
    }
  }
}
