/**
 * A lossless transport for JavaScript values to and from the Python oracle (test/oracle.py).
 *
 * Plain JSON would lose what the hashing must preserve: -0, NaN and the infinities, the
 * difference between undefined and null, bigint, repeated and cyclic references, own
 * `__proto__` keys. So every number travels as its IEEE-754 bits and every container as a
 * tagged object. Strings travel as JSON strings: `JSON.stringify` escapes a lone surrogate
 * (`"\ud800"`) and Python's json module decodes the escape back to that lone code point.
 *
 *   null, true, false, "string"      as themselves
 *   {"d": "<16 hex>"}                a number (float64 bits, big-endian)
 *   {"b": "<decimal>"}               a bigint
 *   {"u": 0}                         undefined
 *   {"f": 0}                         a function or symbol (stableStringify prints null)
 *   {"e": {name, message, stack?}}   an Error
 *   {"y": "<base64>"}                a Uint8Array
 *   {"a": [...], "i": n}             an array, reference id n
 *   {"o": [[key, value], ...], "i": n}  an object's own enumerable string keys, in order
 *   {"r": n}                         a reference to the container with id n (shared or cyclic)
 */

export type Encoded = null | boolean | string | { [tag: string]: unknown };

export function encodeNumber(value: number): string {
  const buffer = Buffer.alloc(8);
  buffer.writeDoubleBE(value);
  return buffer.toString("hex");
}

export function decodeNumber(hex: string): number {
  return Buffer.from(hex, "hex").readDoubleBE();
}

export function encodeValue(value: unknown): Encoded {
  const ids = new Map<object, number>();
  const walk = (v: unknown): Encoded => {
    if (v === null || typeof v === "boolean" || typeof v === "string") {
      return v;
    }
    if (typeof v === "number") {
      return { d: encodeNumber(v) };
    }
    if (typeof v === "bigint") {
      return { b: v.toString() };
    }
    if (v === undefined) {
      return { u: 0 };
    }
    if (typeof v === "function" || typeof v === "symbol") {
      return { f: 0 };
    }
    const obj = v as object;
    const seen = ids.get(obj);
    if (seen !== undefined) {
      return { r: seen };
    }
    if (obj instanceof Error) {
      // Serialised by value (upstream builds a fresh {name, message, stack} object).
      return { e: { name: obj.name, message: obj.message, ...(obj.stack === undefined ? {} : { stack: obj.stack }) } };
    }
    if (obj instanceof Uint8Array) {
      return { y: Buffer.from(obj).toString("base64") };
    }
    const id = ids.size;
    ids.set(obj, id);
    if (Array.isArray(obj)) {
      const items: Encoded[] = [];
      for (const item of obj) {
        items.push(walk(item)); // holes iterate as undefined, as upstream's for..of sees them
      }
      return { a: items, i: id };
    }
    const record = obj as Record<string, unknown>;
    return { o: Object.keys(record).map((key) => [key, walk(record[key])]), i: id };
  };
  return walk(value);
}

/** The inverse, for values the Python side sends (conformance vectors). */
export function decodeValue(encoded: unknown): unknown {
  const byId = new Map<number, object>();
  const walk = (e: unknown): unknown => {
    if (e === null || typeof e === "boolean" || typeof e === "string") {
      return e;
    }
    const tagged = e as Record<string, unknown>;
    if ("d" in tagged) return decodeNumber(tagged.d as string);
    if ("b" in tagged) return BigInt(tagged.b as string);
    if ("u" in tagged) return undefined;
    if ("f" in tagged) return () => undefined;
    if ("r" in tagged) return byId.get(tagged.r as number);
    if ("e" in tagged) {
      const fields = tagged.e as { name: string; message: string; stack?: string };
      const error = new Error(fields.message);
      error.name = fields.name;
      if (fields.stack !== undefined) error.stack = fields.stack;
      return error;
    }
    if ("y" in tagged) return new Uint8Array(Buffer.from(tagged.y as string, "base64"));
    if ("a" in tagged) {
      const out: unknown[] = [];
      byId.set(tagged.i as number, out);
      for (const item of tagged.a as unknown[]) out.push(walk(item));
      return out;
    }
    if ("o" in tagged) {
      const out: Record<string, unknown> = {};
      byId.set(tagged.i as number, out);
      for (const [key, item] of tagged.o as [string, unknown][]) {
        // defineProperty, not assignment: an own "__proto__" key stays a key
        Object.defineProperty(out, key, { value: walk(item), enumerable: true, writable: true, configurable: true });
      }
      return out;
    }
    throw new Error(`unknown transport tag in ${JSON.stringify(e)}`);
  };
  return walk(encoded);
}
