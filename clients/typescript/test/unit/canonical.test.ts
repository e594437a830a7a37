/** stableStringify against the spec's table (§2.2) and its golden digests, written out by hand. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { digest, stableStringify } from "../../src/canonical.js";
import { argsHash } from "../../src/hashing.js";
import { objectFrom } from "../support/arbitraries.js";

const sha256 = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");

test("the spec's golden digests", () => {
  assert.equal(stableStringify({ path: "/file.txt" }), '{"path":"/file.txt"}');
  assert.equal(argsHash("read", { path: "/file.txt" }), "read:fcd70c3cc3a31a5afa413e0119a4058f9c6e65288d5621a73ef706cb0649666b");
  assert.equal(digest({ details: { ok: true }, text: "same output" }), "e8247a52b90c18a8c1ecdca3031675433387e6001940e9a290d3726bf729a020");
});

test("numbers print as ECMAScript prints them", () => {
  const cases: [number, string][] = [
    [1, "1"], [2.5, "2.5"], [-0, "0"], [1e21, "1e+21"], [1e-7, "1e-7"], [1e-5, "0.00001"],
    [1e16, "10000000000000000"], [12345678901234567890, "12345678901234567000"], [5e-324, "5e-324"],
    [1e20, "100000000000000000000"], [123e-20, "1.23e-18"],
  ];
  for (const [value, text] of cases) {
    assert.equal(stableStringify(value), text, String(value));
  }
});

test("non-finite numbers, bigint, undefined, functions and symbols", () => {
  assert.equal(stableStringify([NaN, Infinity, -Infinity, null]), '["NaN","Infinity","-Infinity",null]');
  assert.equal(stableStringify(12345678901234567890123n), '"12345678901234567890123"');
  assert.equal(stableStringify({ status: undefined }), '{"status":undefined}');
  assert.equal(stableStringify(undefined), "undefined");
  assert.equal(stableStringify([() => 1, Symbol("s")]), "[null,null]");
  assert.notEqual(digest({ status: undefined }), digest({ status: null })); // missing is not null
  // array holes iterate as undefined
  assert.equal(stableStringify([1, , 3]), "[1,undefined,3]"); // eslint-disable-line no-sparse-arrays
});

test("strings escape as well-formed JSON.stringify: lone surrogates kept and escaped", () => {
  assert.equal(stableStringify("\ud800"), '"\\ud800"');
  assert.equal(stableStringify("é\u2028\x7f"), '"é\u2028\x7f"');
  assert.equal(stableStringify('\x00\x1f\b\t\n\f\r"\\'), '"\\u0000\\u001f\\b\\t\\n\\f\\r\\"\\\\"');
});

test("keys sort by UTF-16 code units, own __proto__ keys included", () => {
  // U+1F600 is D83D DE00 in UTF-16 and sorts before U+E000 (code points say otherwise).
  assert.equal(stableStringify({ "\ue000": 1, "\u{1f600}": 2 }), '{"\u{1f600}":2,"\ue000":1}');
  assert.equal(stableStringify(objectFrom([["b", 1], ["__proto__", { x: 1 }], ["A", 2]])), '{"A":2,"__proto__":{"x":1},"b":1}');
  assert.equal(stableStringify(JSON.parse('{"__proto__": 5}')), '{"__proto__":5}');
});

test("cycles print as [Circular]; shared references in full", () => {
  const shared = { id: "x" };
  const root: Record<string, unknown> = { a: shared, b: shared };
  root.self = root;
  assert.equal(stableStringify(root), '{"a":{"id":"x"},"b":{"id":"x"},"self":"[Circular]"}');
  const list: unknown[] = [1];
  list.push(list);
  assert.equal(stableStringify(list), '[1,"[Circular]"]');
});

test("Errors and Uint8Arrays as upstream serialises them", () => {
  const error = new TypeError("boom");
  error.stack = "TypeError: boom\n    at here";
  assert.equal(stableStringify(error), '{"message":"boom","name":"TypeError","stack":"TypeError: boom\\n    at here"}');
  assert.equal(stableStringify(new Uint8Array([1, 2, 255])), '{"data":"AQL/","type":"Uint8Array"}');
  assert.equal(stableStringify(Buffer.from("hi")), '{"data":"aGk=","type":"Uint8Array"}');
  assert.equal(stableStringify(new Date(0)), "{}"); // no toJSON: own enumerable keys only
});

test("the digest is SHA-256 of the UTF-8 text, surrogates included", () => {
  assert.equal(digest({ k: "é\u{1f600}" }), sha256('{"k":"é\u{1f600}"}'));
  assert.equal(digest("\ud800"), sha256('"\\ud800"'));
});
