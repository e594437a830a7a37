/**
 * Random values with JavaScript's edge cases, for the cross-language hashing tests:
 * lone surrogates, -0, NaN and the infinities, 1e21 and other formatting boundaries, huge
 * and unsafe integers, bigint, undefined (in objects and as array holes), own `__proto__`
 * keys, keys whose UTF-16 order differs from code-point order, deep nesting, shared and
 * cyclic references, Errors and Uint8Arrays, and tool results shaped to reach every
 * outcome rule, profile latest's included: untrusted-content envelopes with random ids
 * (well-formed, JSON-escaped 1-3 levels deep, and broken in every way the canonicaliser must
 * leave alone), failing commands whose output drifts (timestamps, clock times, durations,
 * pids, attempt counters), and writes that changed their file or not.
 */
import fc from "fast-check";
import type { ToolOutcome } from "../../src/hashing.js";

// -- leaves ------------------------------------------------------------------------------------

/** Characters where JavaScript and Python disagree by default (whitespace, surrogates, escapes). */
const TRICKY_CHARS = [
  "\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00", "\ud83d\ude00", "\ue000", "\uffff",
  "\ufeff", "\u0085", "\u001c", "\u001f", "\u2028", "\u2029", "\u00a0", "\u1680", "\u3000", "\u180e",
  "\u200b", " ", "\t", "\n", "\r", "\v", "\f", "\b", "\u0000", "\u007f", "\"", "\\", "/", "é", "ſ",
  "\u212a", "İ", "ı",
];
const codeUnit = fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c));
const trickyChar = fc.constantFrom(...TRICKY_CHARS);

// -- untrusted-content envelopes (openclaw-latest.md §4.1) --------------------------------------

const START = "<<<EXTERNAL_UNTRUSTED_CONTENT id=";
const END = "<<<END_EXTERNAL_UNTRUSTED_CONTENT id=";
const envelopeId = fc.oneof(
  { weight: 6, arbitrary: fc.stringMatching(/^[a-f0-9]{16}$/) },
  { weight: 1, arbitrary: fc.constantFrom("0000000000000000", "ABCDEF0123456789", "abc", "", "0123456789abcdef0", "g123456789abcdef") },
);
const envelopeBody = fc.oneof(
  fc.string({ maxLength: 10 }),
  fc.constantFrom('say "hi"', 'a \\"pre-escaped\\" word', "back\\slash", "", "\n", START, `${END}"`, "<<<END_EXTERNAL_UNTRUSTED_CONTENT"),
);
/** One JSON string-encoding level: quotes and backslashes escaped (k -> 2k + 1 before a quote). */
const jsonLevel = (text: string) => JSON.stringify(text).slice(1, -1);

/** An envelope, escaped `levels` times; `mangle` breaks one escape (the canonicaliser must then leave it). */
const envelope = fc
  .tuple(envelopeId, fc.oneof({ weight: 5, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: envelopeId }), envelopeBody,
    fc.constantFrom(0, 0, 1, 1, 2, 3),
    fc.constantFrom(null, null, null, null, "slash", "quote", "inner", "even", "cut"))
  .map(([id, otherEnd, body, levels, mangle]) => {
    let text = `${START}"${id}">>>${body}${END}"${otherEnd ?? id}">>>`;
    for (let i = 0; i < levels; i += 1) text = jsonLevel(text);
    if (mangle === "slash") text = text.replace('"', '\\"');
    if (mangle === "quote") text = text.replace(/"(?=>>>)/, '\\"');
    if (mangle === "inner") {
      // one more backslash before the first quote after the start marker's id
      const at = text.indexOf('"', text.indexOf(">>>") + 3);
      text = `${text.slice(0, at)}\\${text.slice(at)}`;
    }
    if (mangle === "even") text = text.replace(/\\*"/g, (quote) => `\\${quote}`); // k + 1 backslashes everywhere: 2, 4, 8
    if (mangle === "cut") text = text.slice(0, text.length - 3);
    return text;
  });

/** Text with one or two envelopes in it, or a lone marker. */
export const envelopeText: fc.Arbitrary<string> = fc
  .tuple(fc.string({ maxLength: 6 }), fc.array(envelope, { minLength: 1, maxLength: 2 }), fc.string({ maxLength: 6 }))
  .map(([before, envelopes, after]) => `${before}${envelopes.join(" ")}${after}`);

export const jsString: fc.Arbitrary<string> = fc.oneof(
  { weight: 3, arbitrary: fc.string({ unit: fc.oneof(codeUnit, trickyChar), maxLength: 12 }) },
  { weight: 3, arbitrary: fc.string({ unit: "binary", maxLength: 12 }) },
  { weight: 3, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 3, arbitrary: fc.constantFrom("", "__proto__", "constructor", "toString", "0", "10", "-1", "1e21", "NaN", "undefined") },
  { weight: 1, arbitrary: envelopeText },
);

/** Keys, with the pairs that sort differently by code point and by UTF-16 code unit. */
export const jsKey: fc.Arbitrary<string> = fc.oneof(
  { weight: 3, arbitrary: jsString },
  { weight: 1, arbitrary: fc.constantFrom("__proto__", "\ue000", "\ud83d\ude00", "\ud800", "\udc00", "a", "A", "b", "id", "text") },
);

export const jsNumber: fc.Arbitrary<number> = fc.oneof(
  fc.double(),
  fc.integer(),
  fc.constantFrom(
    -0, 0, 1, -1, 0.1, 100, 1e21, 1e-7, 1e-6, 1e-5, 1e16, 1e20, 999999999999999900000, 123e-20,
    2 ** 53, 2 ** 53 + 2, -(2 ** 53), 12345678901234567000, 5e-324, 1.7976931348623157e308,
    1.5e300, NaN, Infinity, -Infinity,
  ),
);

const leaf: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 2, arbitrary: fc.constantFrom(null, undefined, true, false) },
  { weight: 4, arbitrary: jsNumber },
  { weight: 4, arbitrary: jsString },
  { weight: 1, arbitrary: fc.bigInt() },
  { weight: 1, arbitrary: fc.constantFrom<unknown>(() => 1, Symbol("s")) },
);

// -- containers --------------------------------------------------------------------------------

/** An object with exactly these own keys: defineProperty keeps "__proto__" a key. */
export function objectFrom(entries: readonly (readonly [string, unknown])[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of entries) {
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function sparse(items: unknown[]): unknown[] {
  const out = new Array<unknown>(items.length + 2); // two holes at the end
  items.forEach((item, i) => {
    if (i % 3 !== 1) out[i] = item; // and a hole every third slot
  });
  return out;
}

const { tree } = fc.letrec((tie) => ({
  tree: fc.oneof({ depthSize: "small", withCrossShrink: true }, leaf, tie("array"), tie("object")),
  array: fc.oneof(
    { weight: 5, arbitrary: fc.array(tie("tree"), { maxLength: 5 }) },
    { weight: 1, arbitrary: fc.array(tie("tree"), { maxLength: 4 }).map(sparse) },
  ),
  object: fc.array(fc.tuple(jsKey, tie("tree")), { maxLength: 5 }).map(objectFrom),
}));

/** `depth` levels of alternating arrays and objects around a leaf. */
const deep: fc.Arbitrary<unknown> = fc
  .tuple(fc.integer({ min: 20, max: 400 }), leaf, fc.boolean())
  .map(([depth, inner, objectFirst]) => {
    let value = inner;
    for (let i = 0; i < depth; i += 1) {
      value = (i % 2 === 0) === objectFirst ? { k: value } : [value];
    }
    return value;
  });

/**
 * Replace some slots with references to an ancestor (a cycle) or to another container.
 * Not below an own `__proto__` key: upstream's stripVolatileSendIds walks into that key's
 * value before the assignment drops it, so a cycle there overflows upstream's stack (and
 * this client's) while streams/edge/hashing.py skips the key unvisited and hashes; that
 * one known difference has its own test (hashing.test.ts).
 */
function withReferences(value: unknown, choices: readonly number[]): unknown {
  const containers: { node: Record<string, unknown> | unknown[]; ancestors: object[]; underProto: boolean }[] = [];
  const visit = (node: unknown, ancestors: object[], underProto: boolean) => {
    if (typeof node !== "object" || node === null) return;
    const container = node as Record<string, unknown> | unknown[];
    containers.push({ node: container, ancestors, underProto });
    for (const [key, child] of Object.entries(container)) {
      visit(child, [...ancestors, container], underProto || key === "__proto__");
    }
  };
  visit(value, [], false);
  let c = 0;
  const next = () => choices[c++ % choices.length] ?? 0;
  for (const { node, ancestors, underProto } of containers) {
    const keys = Object.keys(node).filter((key) => key !== "__proto__");
    if (underProto || keys.length === 0 || next() % 3 !== 0) continue;
    const key = keys[next() % keys.length]!;
    const pool = next() % 2 === 0 && ancestors.length > 0 ? [...ancestors, node] : containers.map((x) => x.node);
    const target = pool[next() % pool.length]!;
    Object.defineProperty(node, key, { value: target, enumerable: true, writable: true, configurable: true });
  }
  return value;
}

const referenced = fc
  .tuple(fc.array(tree, { minLength: 1, maxLength: 4 }), fc.array(fc.nat(1000), { minLength: 8, maxLength: 8 }))
  .map(([items, choices]) => withReferences(items, choices));

function errorWith(name: string, message: string): Error {
  const error = new Error(message);
  error.name = name;
  return error;
}

const hostObjects = fc.oneof(
  fc.tuple(fc.constantFrom("Error", "TypeError", ""), jsString).map(([name, message]) => errorWith(name, message)),
  fc.uint8Array({ maxLength: 16 }),
);

/** Any value a tool's arguments could be, Errors and Uint8Arrays included. */
export const jsValue: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 6, arbitrary: tree },
  { weight: 1, arbitrary: deep },
  { weight: 2, arbitrary: referenced },
  { weight: 1, arbitrary: fc.tuple(tree, hostObjects).map(([t, h]) => objectFrom([["value", t], ["host", h]])) },
);

/** Values without Errors or Uint8Arrays, for positions the outcome rules inspect (there a
 * Python dict and a JavaScript host object would be told apart, which is not the point). */
const plainValue: fc.Arbitrary<unknown> = fc.oneof({ weight: 6, arbitrary: tree }, { weight: 1, arbitrary: referenced });

// -- tool calls and outcomes -------------------------------------------------------------------

export const SEND_TOOLS = ["telegram", "discord"];

const toolName = fc.constantFrom(
  "exec", "process", "message", "sessions_send", "telegram", "discord", "read", "command_status", "write", "bash",
);

const maybe = <T>(arb: fc.Arbitrary<T>) => fc.oneof(arb, fc.constant(undefined));

function argsFor(tool: string): fc.Arbitrary<unknown> {
  if (tool === "process") {
    return fc.oneof(
      fc.tuple(fc.constantFrom("poll", "log", "list", "kill", "POLL", undefined), maybe(jsString)).map(([action, sessionId]) =>
        objectFrom([...(action === undefined ? [] : [["action", action] as const]), ["sessionId", sessionId]]),
      ),
      plainValue,
    );
  }
  if (tool === "message") {
    return fc.oneof(
      fc
        .tuple(
          fc.constantFrom("send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment", "upload-file",
            "sticker", "poll", "read", "react", "Send", 5),
          jsString,
        )
        .map(([action, to]) => objectFrom([["action", action], ["to", to]])),
      plainValue,
    );
  }
  return fc.oneof({ weight: 3, arbitrary: plainValue }, { weight: 1, arbitrary: jsValue });
}

const spaced = fc
  .tuple(fc.array(fc.constantFrom(" ", "\t", "\n", "\ufeff", "\u0085", "\u00a0", "\u2028", "\u001c", "\u3000"), { maxLength: 3 }), jsString)
  .map(([pad, text]) => `${pad.join("")}${text}${pad.reverse().join("")}`);

const VOLATILE_KEYS = [
  "messageId", "message_id", "messageIds", "platformMessageId", "platformMessageIds", "fileId", "file_id",
  "fileKey", "pollId", "poll_id", "receipt", "runId", "idempotencyKey", "ts", "timestamp", "sentAt",
  "deliveredAt", "createdAt", "__proto__",
];

const deliveryObject = fc
  .tuple(jsString, spaced, fc.constantFrom("direction", "senderId", "accountId", "conversation", "other"), plainValue)
  .map(([id, text, marker, rest]) =>
    objectFrom([["id", id], ["text", text], [marker, marker === "conversation" ? { id: "c1" } : "out"], ["extra", rest]]),
  );

function isCyclic(value: unknown, ancestors: object[] = []): boolean {
  if (typeof value !== "object" || value === null) return false;
  if (ancestors.includes(value)) return true;
  return Object.values(value).some((child) => isCyclic(child, [...ancestors, value]));
}

/** See withReferences: no cycle below an own `__proto__` key of a send result's details. */
const protoSafe = ([key, value]: readonly [string, unknown]): readonly [string, unknown] =>
  key === "__proto__" && isCyclic(value) ? [key, null] : [key, value];

const detailFieldAny: fc.Arbitrary<readonly [string, unknown]> = fc.oneof(
  fc.tuple(fc.constant("status"), fc.constantFrom("running", "completed", "failed", "approval-pending",
    "approval-unavailable", "blocked", "weird", "", undefined, null, 5)),
  fc.tuple(fc.constantFrom("exitCode", "exitSignal", "totalLines", "totalChars"),
    fc.oneof(fc.constantFrom(0, 1, -0, NaN, "1", undefined, null, 2.5, Infinity), jsNumber)),
  fc.tuple(fc.constantFrom("aggregated", "tail", "reason", "host", "command", "warningText", "text"),
    fc.oneof(spaced, fc.constantFrom(undefined, null, 7, ""))),
  fc.tuple(fc.constantFrom("timedOut", "truncated"), fc.constantFrom(true, false, "true", 1, undefined, null)),
  fc.tuple(fc.constant("deniedReason"), fc.constantFrom("tool-loop", "plugin-before-tool-call", "plugin-approval", undefined)),
  fc.tuple(fc.constantFrom(...VOLATILE_KEYS), plainValue),
  fc.tuple(fc.constantFrom("message", "messages", "result"), fc.oneof(deliveryObject, fc.array(deliveryObject, { maxLength: 3 }))),
  fc.tuple(jsKey, plainValue),
);
const detailField = detailFieldAny.map(protoSafe);

const details = fc.oneof(
  { weight: 4, arbitrary: fc.array(detailField, { maxLength: 7 }).map(objectFrom) },
  { weight: 1, arbitrary: plainValue },
);

const contentEntry = fc.oneof(
  fc.tuple(fc.constantFrom("text", "image", "json", ""), spaced).map(([type, text]) => ({ type, text })),
  fc.tuple(fc.oneof(fc.constant(undefined), fc.constant(5)), spaced).map(([type, text]) => objectFrom([["type", type], ["text", text]])),
  plainValue,
);

const structuredResult = fc
  .tuple(maybe(fc.oneof(fc.array(contentEntry, { maxLength: 4 }), plainValue)), maybe(details), fc.array(fc.tuple(jsKey, plainValue), { maxLength: 2 }))
  .map(([content, d, extra]) =>
    objectFrom([...extra, ...(content === undefined ? [] : [["content", content] as const]), ...(d === undefined ? [] : [["details", d] as const])]),
  );

const UNKNOWN_TOOL_TEMPLATES = [
  (n: string, s: string) => `unknown tool:${s}${n}`,
  (n: string, s: string) => `Unknown Tool${s}"${n}"`,
  (n: string, s: string) => `error: unknown tool: '${n}' requested`,
  (n: string, s: string) => `Tool${s}${n}${s}not found`,
  (n: string, s: string) => `tool '${n}'${s}is not available`,
  (n: string, s: string) => `TOOL ${n} NOT FOUND${s}`,
];
const unknownToolText = fc
  .tuple(
    fc.nat(UNKNOWN_TOOL_TEMPLATES.length - 1),
    fc.oneof(fc.stringMatching(/^[A-Za-z0-9_.-]{1,12}$/), fc.constantFrom("ſearch", "\u212aube", "İmage", "Read", "a-b.c_d")),
    fc.constantFrom(" ", "  ", "\u00a0", "\ufeff", "\u2028", "\u0085", "\t", ": "),
    spaced,
  )
  .map(([t, name, sep, pad]) => `${pad}${UNKNOWN_TOOL_TEMPLATES[t]!(name, sep)}`);

const thrown: fc.Arbitrary<unknown> = fc.oneof(
  fc.tuple(fc.constantFrom("Error", "TypeError", ""), fc.oneof(unknownToolText, spaced, fc.constant(""))).map(([name, message]) => errorWith(name, message)),
  unknownToolText,
  spaced,
  jsNumber,
  fc.constantFrom(true, false, null),
  fc.bigInt(),
  plainValue,
);

// -- exec terminal failures with drifting output (openclaw-latest.md §4.2) ---------------------

const pad = (n: number, width: number) => String(n).padStart(width, "0");
const digits = (max: number) => fc.integer({ min: 0, max });
const fraction = fc.oneof(fc.constant(""), fc.integer({ min: 1, max: 8 }).chain((n) => fc.stringMatching(new RegExp(`^\\.[0-9]{${n}}$`))));

const driftToken: fc.Arbitrary<string> = fc.oneof(
  // ISO timestamps (masked whole, zone and fraction included; a bare date is not)
  fc.tuple(digits(9999), digits(12), digits(31), fc.constantFrom("T", "t", " ", "_"), digits(23), digits(59), digits(61), fraction,
    fc.constantFrom("", "Z", "z", "+02:00", "-0530", "+2:00"))
    .map(([y, mo, d, sep, h, mi, s, f, zone]) => `${pad(y, 4)}-${pad(mo, 2)}-${pad(d, 2)}${sep}${pad(h, 2)}:${pad(mi, 2)}:${pad(s, 2)}${f}${zone}`),
  fc.tuple(digits(99), digits(99), digits(99), fraction).map(([h, m, s, f]) => `${h}:${pad(m, 2)}:${pad(s, 2)}${f}`),
  // attempt and retry counters
  fc.tuple(fc.constantFrom("attempt", "Attempt", "RETRY", "retry", "retries", "reattempt"), fc.constantFrom("", " ", "#", " #", ": ", "=", " - "), digits(1000))
    .map(([word, sep, n]) => `${word}${sep}${n}`),
  // durations in every unit, Unicode folds included (ſ is s under /iu)
  fc.tuple(digits(100000), fc.oneof(fc.constant(""), fc.constant(".5"), fc.constant(".25")), fc.constantFrom("", " ", "  "),
    fc.constantFrom("ns", "us", "µs", "ms", "MS", "s", "S", "sec", "second", "seconds", "minute", "minutes", "hour", "hours", "ſ", "ſeconds", "msx", "h"))
    .map(([n, f, sep, unit]) => `${n}${f}${sep}${unit}`),
  // process ids
  fc.tuple(fc.constantFrom("pid", "PID", "ppid", "Pid", "pidfile", "ſpid"), fc.constantFrom("", " ", "=", ": ", " #"), digits(99999))
    .map(([word, sep, n]) => `${word}${sep}${n}`),
  // numbers that stay part of the identity
  fc.constantFrom("2026-08-10", "errno 13", "exit 2", "line 42", "v1.2.3", "0x1f", "ſ", "\u212a"),
);

const failureOutput: fc.Arbitrary<string> = fc
  .tuple(
    fc.constantFrom("Error: connect ECONNREFUSED", "FAILED tests/test_x.py", "fatal: not a git repository", "Traceback (most recent call last):", ""),
    fc.array(fc.tuple(driftToken, fc.constantFrom(" ", "\n", ", ", " (", ") ", "")), { maxLength: 5 }),
    fc.oneof({ weight: 4, arbitrary: fc.constant("") }, { weight: 1, arbitrary: envelopeText }),
  )
  .map(([head, tokens, tail]) => `${head}${tokens.map(([t, sep]) => `${sep}${t}`).join("")}${tail}`);

const execExitCode = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(1, 2, 127, -1, 255) },
  { weight: 2, arbitrary: fc.constantFrom(0, -0, 1.5, NaN, Infinity, -Infinity, "1", null, undefined, true) },
);

const execFailure = fc
  .tuple(fc.constantFrom("completed", "failed", "failed", "running"), execExitCode, fc.constantFrom(undefined, false, true, "true"),
    fc.oneof({ weight: 4, arbitrary: failureOutput }, { weight: 1, arbitrary: fc.constantFrom(undefined, "", "  \n", 5) }),
    fc.oneof({ weight: 3, arbitrary: failureOutput }, { weight: 1, arbitrary: fc.constant("(footer)") }), digits(100000))
  .map(([status, exitCode, timedOut, aggregated, text, durationMs]) => ({
    content: [{ type: "text", text: text === "(footer)" ? `(Command exited with code ${String(exitCode)})` : text }],
    details: objectFrom([
      ["status", status], ["exitCode", exitCode], ["timedOut", timedOut], ["aggregated", aggregated],
      ["durationMs", durationMs], ["pid", durationMs % 9999],
    ].filter(([, value]) => value !== undefined || durationMs % 3 === 0) as [string, unknown][]),
  }));

// -- write outcomes and targets (openclaw-latest.md §4.3) ---------------------------------------

const writePath: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom("notes.md", "./notes.md", "/tmp/a b.txt", " notes.md", "ſ.txt", "\ud800", "C:\\x.txt", "") },
  { weight: 2, arbitrary: jsString },
  { weight: 1, arbitrary: fc.constantFrom(5, null, undefined, ["a"], { p: 1 }) },
);

export const writeArgs: fc.Arbitrary<unknown> = fc
  .tuple(writePath, maybe(jsString), fc.boolean())
  .map(([path, content, withPath]) => objectFrom([...(withPath ? [["path", path] as const] : []), ["content", content]]));

const writeResult = fc
  .tuple(fc.constantFrom(true, false, true, false, "false", 0, undefined, null), fc.oneof(spaced, fc.constantFrom("No changes", "Wrote 12 bytes")), writePath, fc.boolean())
  .map(([changed, text, path, detailsObject]) => ({
    content: [{ type: "text", text }],
    details: detailsObject ? objectFrom([["changed", changed], ["path", path], ["bytes", 12]]) : [changed],
  }));

export interface OutcomeCase {
  tool: string;
  args: unknown;
  outcome: ToolOutcome;
}

const anyOutcome = (tool: string): fc.Arbitrary<OutcomeCase> =>
  fc.tuple(
    argsFor(tool),
    fc.oneof(
      { weight: 6, arbitrary: structuredResult.map((result): ToolOutcome => ({ result })) },
      { weight: 2, arbitrary: plainValue.map((result): ToolOutcome => ({ result })) },
      { weight: 3, arbitrary: thrown.filter((e) => e !== undefined).map((error): ToolOutcome => ({ error })) },
    ),
  ).map(([args, outcome]) => ({ tool, args, outcome }));

export const outcomeCase: fc.Arbitrary<OutcomeCase> = fc.oneof(
  { weight: 8, arbitrary: toolName.chain(anyOutcome) },
  { weight: 2, arbitrary: fc.tuple(argsFor("exec"), execFailure).map(([args, result]) => ({ tool: "exec", args, outcome: { result } })) },
  { weight: 2, arbitrary: fc.tuple(writeArgs, writeResult).map(([args, result]) => ({ tool: "write", args, outcome: { result } })) },
  {
    weight: 1,
    arbitrary: fc.tuple(fc.constantFrom("web_fetch", "read", "exec", "write"), envelopeText, envelopeText, jsKey).map(([tool, text, inDetails, key]) => ({
      tool,
      args: { url: "https://example.com" },
      outcome: { result: { content: [{ type: "text", text }], details: objectFrom([[key, inDetails], [inDetails, 1]]) } },
    })),
  },
);

export const argsCase = fc.oneof(
  { weight: 6, arbitrary: fc.tuple(toolName, jsValue).map(([tool, args]) => ({ tool, args })) },
  { weight: 1, arbitrary: writeArgs.map((args) => ({ tool: "write", args })) },
);
