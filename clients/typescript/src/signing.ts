/**
 * Signed events (`schemas/signing.py`, README "Signed events"): with a key of its agent, a
 * runner signs every record it publishes on `tool-calls`, and workers that require signed
 * events dead-letter (`bad_signature`) anything unsigned, signed wrongly or with another
 * agent's key.
 *
 * * header `loopwatch.key_id`: the key's id (UTF-8);
 * * header `loopwatch.signature`: `sha256=` + lowercase hex HMAC-SHA-256 of the record value
 *   (the exact bytes published), keyed with the key's secret (its raw bytes, not their base64);
 * * the event's `agent_id` is the key's agent;
 * * the event's `ts_ms` (signed with the value) is at most the workers'
 *   `LOOPWATCH_SIGNED_MAX_AGE_S` before the record's Kafka timestamp and before the newest
 *   event of its run, or the event is refused as a replay (`stale_event`): the client stamps
 *   `ts_ms` when it makes an event and publishes it at once.
 * * the event's `seq` (signed with the value; the client numbers every event, `sequence.ts`)
 *   is above the highest its run applied, or the event is refused as a replay
 *   (`replayed_event`), however recent.
 *
 * Key files are the workers' format: JSON, one object or a list, each
 * `{"key_id": "...", "agent_id": "...", "secret": "<base64 of at least 32 bytes>"}`.
 */
import { createHmac } from "node:crypto";
import { readFileSync } from "node:fs";
import { ConfigError } from "./errors.js";

export const KEY_ID_HEADER = "loopwatch.key_id";
export const SIGNATURE_HEADER = "loopwatch.signature";
/** HMAC-SHA-256 keys shorter than its output (32 bytes) weaken it (RFC 2104 §3). */
export const MIN_SECRET_BYTES = 32;
const KEY_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const MAX_AGENT_ID = 512;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Key material that cannot be used (the message names the source and the problem). */
export class SigningKeyError extends ConfigError {
  override name = "SigningKeyError";
}

/** One agent's key. The secret is a private field: it never shows in `inspect`, JSON or logs. */
export class SigningKey {
  readonly #secret: Buffer;

  constructor(
    readonly keyId: string,
    readonly agentId: string,
    secret: Uint8Array,
  ) {
    if (typeof keyId !== "string" || !KEY_ID.test(keyId)) {
      const shown = typeof keyId === "string" ? `'${keyId}'` : String(keyId); // as schemas.signing words it
      throw new SigningKeyError(`key id ${shown}: 1 to 128 characters of A-Z a-z 0-9 . _ : -`);
    }
    if (typeof agentId !== "string" || agentId.length === 0 || [...agentId].length > MAX_AGENT_ID) {
      throw new SigningKeyError(`key ${keyId}: agent_id must be a non-empty string (at most ${MAX_AGENT_ID} characters)`);
    }
    if (!(secret instanceof Uint8Array) || secret.length < MIN_SECRET_BYTES) {
      throw new SigningKeyError(`key ${keyId}: the secret must be at least ${MIN_SECRET_BYTES} bytes`);
    }
    this.#secret = Buffer.from(secret);
  }

  /** `sha256=<hex HMAC-SHA-256 of value>`. */
  signature(value: Uint8Array): string {
    return `sha256=${createHmac("sha256", this.#secret).update(value).digest("hex")}`;
  }

  /** The record headers that sign `value`. */
  headers(value: Uint8Array): [string, string][] {
    return [
      [KEY_ID_HEADER, this.keyId],
      [SIGNATURE_HEADER, this.signature(value)],
    ];
  }

  toString(): string {
    return `SigningKey(${this.keyId}, agent ${JSON.stringify(this.agentId)})`;
  }
}

/** The keys of one key file's content; `SigningKeyError` naming `source`. */
export function parseKeys(data: string | Uint8Array, source = "<keys>"): SigningKey[] {
  let doc: unknown;
  try {
    doc = JSON.parse(typeof data === "string" ? data : Buffer.from(data).toString("utf8"));
  } catch (err) {
    throw new SigningKeyError(`${source}: not JSON (${(err as Error).message})`);
  }
  const entries = Array.isArray(doc) ? doc : [doc];
  return entries.map((entry: unknown, i) => {
    const where = Array.isArray(doc) ? `${source}[${i}]` : source;
    const keys = typeof entry === "object" && entry !== null && !Array.isArray(entry) ? Object.keys(entry).sort() : [];
    if (keys.join(",") !== "agent_id,key_id,secret") {
      throw new SigningKeyError(`${where}: expected an object with exactly key_id, agent_id and secret`);
    }
    const { key_id: keyId, agent_id: agentId, secret } = entry as Record<string, unknown>;
    if (typeof secret !== "string" || !BASE64.test(secret)) {
      throw new SigningKeyError(`${where}: secret is not base64`);
    }
    try {
      return new SigningKey(keyId as string, agentId as string, Buffer.from(secret, "base64"));
    } catch (err) {
      throw new SigningKeyError(`${where}: ${(err as Error).message}`);
    }
  });
}

/** Every key in a key file (at least one). */
export function loadKeys(path: string): SigningKey[] {
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (err) {
    throw new SigningKeyError(`${path}: cannot read (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  const keys = parseKeys(data, path);
  if (keys.length === 0) {
    throw new SigningKeyError(`${path}: no signing keys in the file`);
  }
  return keys;
}
