/**
 * The one module that talks to Kafka (through @platformatic/kafka's public API only; why that
 * client is in README.md). It publishes `tool-calls` records and reads `loop-verdicts` from
 * the end of every partition; everything else in the package is Kafka-agnostic.
 */
import { once } from "node:events";
import { randomUUID } from "node:crypto";
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
  #stream: MessagesStream<Buffer, Buffer, Buffer, Buffer> | null = null;

  constructor(settings: KafkaSettings, topics: Topics, private readonly onRecord: (record: VerdictRecord) => void) {
    const common = connectionOptions(settings);
    this.#topics = topics;
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
    const stream = await this.#consumer.consume({
      topics: [this.#topics.verdicts],
      mode: "latest",
      autocommit: false,
      maxWaitTime: 500,
    });
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
    const results = await Promise.allSettled([
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
