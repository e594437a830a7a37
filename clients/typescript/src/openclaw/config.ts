/**
 * The plugin's config (`plugins.entries.loopwatch.config`), as `openclaw.plugin.json`'s
 * `configSchema` describes it, turned into client options. OpenClaw validates the config
 * against the manifest before loading the plugin; this parser repeats the checks so a host
 * that does not still gets one clear line per mistake.
 */
import { readFileSync } from "node:fs";
import type { ConnectionOptions as TlsOptions } from "node:tls";
import type { ClientOptions } from "../client.js";
import { ConfigError } from "../errors.js";
import type { SaslSettings } from "../kafka.js";
import { loadKeys, SigningKeyError, type SigningKey } from "../signing.js";

/** @deprecated Use `ConfigError` (what the plugin's config errors are now). */
export const PluginConfigError = ConfigError;
/** @deprecated Use `ConfigError`. */
export type PluginConfigError = ConfigError;

type Json = Record<string, unknown>;

const TOP_LEVEL = new Set([
  "brokers", "mode", "timeoutMs", "failClosed", "toolCallsTopic", "verdictsTopic",
  "providerSendTools", "clientId", "connectTimeoutMs", "startTimeoutMs", "groupIdPrefix", "tls", "sasl", "signing",
]);
const TLS_KEYS = new Set(["enabled", "caFile", "certFile", "keyFile", "servername", "rejectUnauthorized"]);
const SASL_KEYS = new Set(["mechanism", "username", "password", "passwordEnv", "token", "tokenEnv"]);
const MECHANISMS = new Set(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]);
const SIGNING_KEYS = new Set(["keyFile", "keyId"]);

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function fail(path: string, message: string): never {
  throw new ConfigError(`loopwatch plugin config: ${path} ${message}`);
}

function onlyKeys(value: Json, allowed: Set<string>, path: string): void {
  for (const key of Object.keys(value)) {
    if (!allowed.has(key)) {
      fail(`${path}${key}`, "is not a known setting");
    }
  }
}

function string(value: unknown, path: string, { empty = false } = {}): string {
  if (typeof value !== "string" || (!empty && value.length === 0)) {
    fail(path, empty ? "must be a string" : "must be a non-empty string");
  }
  return value;
}

function integer(value: unknown, path: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    fail(path, `must be an integer from ${min} to ${max}`);
  }
  return value;
}

function boolean(value: unknown, path: string): boolean {
  if (typeof value !== "boolean") {
    fail(path, "must be true or false");
  }
  return value;
}

function readFile(path: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    fail(what, `cannot be read (${(err as NodeJS.ErrnoException).code ?? String(err)}): ${path}`);
  }
}

function fromEnv(name: string, path: string, env: NodeJS.ProcessEnv): string {
  const value = env[name];
  if (value === undefined) {
    fail(path, `names the environment variable ${name}, which is not set`);
  }
  return value;
}

function tlsOptions(value: unknown): TlsOptions | undefined {
  if (!isObject(value)) {
    fail("tls", "must be an object");
  }
  onlyKeys(value, TLS_KEYS, "tls.");
  if (value.enabled !== undefined && !boolean(value.enabled, "tls.enabled")) {
    return undefined;
  }
  const options: TlsOptions = {};
  if (value.caFile !== undefined) options.ca = readFile(string(value.caFile, "tls.caFile"), "tls.caFile");
  if (value.certFile !== undefined) options.cert = readFile(string(value.certFile, "tls.certFile"), "tls.certFile");
  if (value.keyFile !== undefined) options.key = readFile(string(value.keyFile, "tls.keyFile"), "tls.keyFile");
  if (value.servername !== undefined) options.servername = string(value.servername, "tls.servername");
  if (value.rejectUnauthorized !== undefined) {
    options.rejectUnauthorized = boolean(value.rejectUnauthorized, "tls.rejectUnauthorized");
  }
  if ((options.cert === undefined) !== (options.key === undefined)) {
    fail("tls", "needs both certFile and keyFile for mutual TLS");
  }
  return options;
}

function saslSettings(value: unknown, env: NodeJS.ProcessEnv): SaslSettings {
  if (!isObject(value)) {
    fail("sasl", "must be an object");
  }
  onlyKeys(value, SASL_KEYS, "sasl.");
  const mechanism = value.mechanism;
  if (typeof mechanism !== "string" || !MECHANISMS.has(mechanism)) {
    fail("sasl.mechanism", `must be one of ${[...MECHANISMS].join(", ")}`);
  }
  const sasl: SaslSettings = { mechanism: mechanism as SaslSettings["mechanism"] };
  if (value.password !== undefined && value.passwordEnv !== undefined) {
    fail("sasl", "takes password or passwordEnv, not both");
  }
  if (value.token !== undefined && value.tokenEnv !== undefined) {
    fail("sasl", "takes token or tokenEnv, not both");
  }
  if (value.username !== undefined) sasl.username = string(value.username, "sasl.username", { empty: true });
  if (value.password !== undefined) sasl.password = string(value.password, "sasl.password", { empty: true });
  if (value.passwordEnv !== undefined) {
    sasl.password = fromEnv(string(value.passwordEnv, "sasl.passwordEnv"), "sasl.passwordEnv", env);
  }
  if (value.token !== undefined) sasl.token = string(value.token, "sasl.token", { empty: true });
  if (value.tokenEnv !== undefined) sasl.token = fromEnv(string(value.tokenEnv, "sasl.tokenEnv"), "sasl.tokenEnv", env);
  if (mechanism === "OAUTHBEARER" ? sasl.token === undefined : sasl.username === undefined || sasl.password === undefined) {
    fail("sasl", mechanism === "OAUTHBEARER" ? "OAUTHBEARER needs token or tokenEnv" : `${mechanism} needs username and password (or passwordEnv)`);
  }
  return sasl;
}

/**
 * The keys to sign with: every key of the key file (the workers' format), one per agent, or
 * only `keyId`'s when the file holds several keys of an agent (a rotation).
 */
function signingKeys(value: unknown): SigningKey[] {
  if (!isObject(value)) {
    fail("signing", "must be an object");
  }
  onlyKeys(value, SIGNING_KEYS, "signing.");
  const file = string(value.keyFile, "signing.keyFile");
  let keys: SigningKey[];
  try {
    keys = loadKeys(file);
  } catch (err) {
    if (err instanceof SigningKeyError) {
      fail("signing.keyFile", err.message);
    }
    throw err;
  }
  if (value.keyId !== undefined) {
    const keyId = string(value.keyId, "signing.keyId");
    keys = keys.filter((key) => key.keyId === keyId);
    if (keys.length === 0) {
      fail("signing.keyId", `${keyId} is not a key of ${file}`);
    }
  }
  const byAgent = new Map<string, SigningKey>();
  for (const key of keys) {
    const other = byAgent.get(key.agentId);
    if (other !== undefined) {
      fail("signing", `${file} holds keys ${other.keyId} and ${key.keyId} of agent ${JSON.stringify(key.agentId)}: name the one to sign with in signing.keyId`);
    }
    byAgent.set(key.agentId, key);
  }
  return keys;
}

/** Client options from the plugin config; throws `ConfigError` with one clear line. */
export function clientOptionsFromConfig(config: unknown, env: NodeJS.ProcessEnv = process.env): ClientOptions {
  if (!isObject(config)) {
    fail("(root)", "must be an object with at least brokers");
  }
  onlyKeys(config, TOP_LEVEL, "");
  if (!Array.isArray(config.brokers) || config.brokers.length === 0) {
    fail("brokers", "must be a non-empty list of host:port");
  }
  const options: ClientOptions = {
    brokers: config.brokers.map((broker, i) => string(broker, `brokers[${i}]`)),
  };
  if (config.mode !== undefined) {
    if (config.mode !== "gate" && config.mode !== "advisory") {
      fail("mode", "must be gate or advisory");
    }
    options.mode = config.mode;
  }
  if (config.timeoutMs !== undefined) options.timeoutMs = integer(config.timeoutMs, "timeoutMs", 1, 600_000);
  if (config.failClosed !== undefined) options.failClosed = boolean(config.failClosed, "failClosed");
  if (config.toolCallsTopic !== undefined) options.toolCallsTopic = string(config.toolCallsTopic, "toolCallsTopic");
  if (config.verdictsTopic !== undefined) options.verdictsTopic = string(config.verdictsTopic, "verdictsTopic");
  if (config.providerSendTools !== undefined) {
    if (!Array.isArray(config.providerSendTools)) {
      fail("providerSendTools", "must be a list of tool names");
    }
    options.providerSendTools = config.providerSendTools.map((tool, i) => string(tool, `providerSendTools[${i}]`));
  }
  if (config.clientId !== undefined) options.clientId = string(config.clientId, "clientId");
  if (config.connectTimeoutMs !== undefined) options.connectTimeoutMs = integer(config.connectTimeoutMs, "connectTimeoutMs", 1);
  if (config.startTimeoutMs !== undefined) options.startTimeoutMs = integer(config.startTimeoutMs, "startTimeoutMs", 1);
  if (config.groupIdPrefix !== undefined) options.groupIdPrefix = string(config.groupIdPrefix, "groupIdPrefix");
  if (config.tls !== undefined) {
    const tls = tlsOptions(config.tls);
    if (tls !== undefined) options.tls = tls;
  }
  if (config.sasl !== undefined) options.sasl = saslSettings(config.sasl, env);
  if (config.signing !== undefined) options.signingKey = signingKeys(config.signing);
  return options;
}
