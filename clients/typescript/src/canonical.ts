/**
 * Canonical serialisation and digests: upstream OpenClaw's `stableStringify` (spec §2.2) and
 * the SHA-256 of it, with profile `latest`'s optional normaliser (openclaw-latest.md §4.1).
 *
 * This is upstream's algorithm run in the same language, so JavaScript semantics come for
 * free: numbers print as `JSON.stringify` prints them, strings escape as well-formed
 * `JSON.stringify` escapes them (lone surrogates kept, escaped), keys sort by UTF-16 code
 * units (the default `Array.prototype.sort`). The one difference from the later upstream
 * file is deliberate: the profile's serialiser is lossless, so surrogates are not sanitised.
 */
import { createHash } from "node:crypto";

/** Rewrites a string before it is quoted (profile latest: envelope ids canonicalised). */
export type Normalizer = (text: string) => string;

/**
 * Upstream's `stableStringify`: deterministic, cycle-safe, never throws for JSON-like input.
 * With `normalize`, every string value and every object key goes through it before it is
 * quoted, and an object's fields are ordered by their normalised key, ties by the original.
 */
export function stableStringify(value: unknown, normalize?: Normalizer): string {
  return stringifyValue(value, new WeakSet(), normalize, 0);
}

/**
 * The deepest nesting of arrays and objects the client hashes: the Python edge's bound
 * (`streams.edge.canonical.JSON_DEPTH_LIMIT`), so both clients refuse the same values rather than
 * each overflowing its own stack at a different depth. A scalar has depth 0, `[]` depth 1.
 */
export const JSON_DEPTH_LIMIT = 128;

/** A value nested deeper than `JSON_DEPTH_LIMIT` (the Python edge's `TooDeep`). */
export class TooDeepError extends RangeError {
  override name = "TooDeep";

  constructor() {
    super(`nested deeper than ${JSON_DEPTH_LIMIT} levels of lists and objects`);
  }
}

/** Lowercase hex SHA-256 of a text, UTF-8 encoded. */
export function sha256Hex(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

/** Lowercase hex SHA-256 of `stableStringify(value, normalize)`. */
export function digest(value: unknown, normalize?: Normalizer): string {
  return sha256Hex(stableStringify(value, normalize));
}

/** `depth`: how many arrays and objects enclose `value`. */
function stringifyValue(value: unknown, ancestors: WeakSet<object>, normalize: Normalizer | undefined, depth: number): string {
  if (value === null || value === undefined) {
    return String(value);
  }
  if (typeof value === "number" && !Number.isFinite(value)) {
    return JSON.stringify(String(value));
  }
  if (typeof value === "bigint") {
    return JSON.stringify(value.toString());
  }
  if (typeof value === "string") {
    return JSON.stringify(normalize === undefined ? value : normalize(value));
  }
  if (typeof value !== "object") {
    // booleans and finite numbers; functions and symbols give undefined, hence "null"
    return JSON.stringify(value) ?? "null";
  }
  if (ancestors.has(value)) {
    return JSON.stringify("[Circular]");
  }
  if (depth >= JSON_DEPTH_LIMIT) {
    throw new TooDeepError();
  }
  ancestors.add(value);
  try {
    return stringifyObject(value, ancestors, normalize, depth);
  } finally {
    ancestors.delete(value);
  }
}

function stringifyObject(value: object, ancestors: WeakSet<object>, normalize: Normalizer | undefined, depth: number): string {
  // An Error or a Uint8Array prints as the object that stands for it, at its own depth.
  if (value instanceof Error) {
    return stringifyValue({ name: value.name, message: value.message, stack: value.stack }, ancestors, normalize, depth);
  }
  if (value instanceof Uint8Array) {
    return stringifyValue({ type: "Uint8Array", data: Buffer.from(value).toString("base64") }, ancestors, normalize, depth);
  }
  if (Array.isArray(value)) {
    const entries: string[] = [];
    for (const entry of value) {
      entries.push(stringifyValue(entry, ancestors, normalize, depth + 1));
    }
    return `[${entries.join(",")}]`;
  }
  const record = value as Record<string, unknown>;
  const fields: string[] = [];
  if (normalize === undefined) {
    for (const key of Object.keys(record).sort()) {
      fields.push(`${JSON.stringify(key)}:${stringifyValue(record[key], ancestors, normalize, depth + 1)}`);
    }
  } else {
    const keys = Object.keys(record).map((key) => [key, normalize(key)] as const);
    keys.sort(([a, shownA], [b, shownB]) => compareUnits(shownA, shownB) || compareUnits(a, b));
    for (const [key, shown] of keys) {
      fields.push(`${JSON.stringify(shown)}:${stringifyValue(record[key], ancestors, normalize, depth + 1)}`);
    }
  }
  return `{${fields.join(",")}}`;
}

/** UTF-16 code-unit order, as the default sort compares. */
function compareUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Upstream's `isPlainObject` (src/infra/plain-object.ts): no arrays, no host objects. */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return (
    typeof value === "object" &&
    value !== null &&
    !Array.isArray(value) &&
    Object.prototype.toString.call(value) === "[object Object]"
  );
}
