/**
 * Canonical serialisation and digests: upstream OpenClaw's `stableStringify` (profile
 * `configurable-final`, spec §2.2) and the SHA-256 of it.
 *
 * This is upstream's algorithm run in the same language, so JavaScript semantics come for
 * free: numbers print as `JSON.stringify` prints them, strings escape as well-formed
 * `JSON.stringify` escapes them (lone surrogates kept, escaped), keys sort by UTF-16 code
 * units (the default `Array.prototype.sort`). The one difference from the later upstream
 * file is deliberate: the profile's serialiser is lossless, so surrogates are not sanitised.
 */
import { createHash } from "node:crypto";

/** Upstream's `stableStringify`: deterministic, cycle-safe, never throws for JSON-like input. */
export function stableStringify(value: unknown): string {
  return stringifyValue(value, new WeakSet());
}

/** Lowercase hex SHA-256 of `stableStringify(value)`, UTF-8 encoded. */
export function digest(value: unknown): string {
  return createHash("sha256").update(stableStringify(value), "utf8").digest("hex");
}

function stringifyValue(value: unknown, ancestors: WeakSet<object>): string {
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
    return JSON.stringify(value);
  }
  if (typeof value !== "object") {
    // booleans and finite numbers; functions and symbols give undefined, hence "null"
    return JSON.stringify(value) ?? "null";
  }
  if (ancestors.has(value)) {
    return JSON.stringify("[Circular]");
  }
  ancestors.add(value);
  try {
    return stringifyObject(value, ancestors);
  } finally {
    ancestors.delete(value);
  }
}

function stringifyObject(value: object, ancestors: WeakSet<object>): string {
  if (value instanceof Error) {
    return stringifyValue({ name: value.name, message: value.message, stack: value.stack }, ancestors);
  }
  if (value instanceof Uint8Array) {
    return stringifyValue({ type: "Uint8Array", data: Buffer.from(value).toString("base64") }, ancestors);
  }
  if (Array.isArray(value)) {
    const entries: string[] = [];
    for (const entry of value) {
      entries.push(stringifyValue(entry, ancestors));
    }
    return `[${entries.join(",")}]`;
  }
  const record = value as Record<string, unknown>;
  const fields: string[] = [];
  for (const key of Object.keys(record).sort()) {
    fields.push(`${JSON.stringify(key)}:${stringifyValue(record[key], ancestors)}`);
  }
  return `{${fields.join(",")}}`;
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
