/**
 * Gemini CLI's content loop detector at the edge (src/geminiContent.ts): the same model.text
 * records, byte for byte, as the project's Python edge (streams/edge/content_windows.py via
 * test/oracle.py) on shared vectors: the golden content sessions' chunks (resets, code blocks,
 * truncation, astral characters and lone surrogates) and random text.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { join } from "node:path";
import fc from "fast-check";
import { encodeEvent, modelTextEvent, type EventFields } from "../../src/events.js";
import { ContentEdge } from "../../src/geminiContent.js";
import { REPO_ROOT } from "../support/paths.js";
import { askPython } from "../support/python.js";

const ORACLE_FIELDS: EventFields = { run_id: "oracle-run", session_key: "oracle", session_id: null, agent_id: null, tsMs: 0 };
const SEED = Number(process.env.LOOPWATCH_FC_SEED ?? 20261201);

type Session = { id: string; events: { k: string; text?: string }[] };

/** Each session's chunks, a tool call or a prompt as null (both reset the edge). */
function vectors(): (string | null)[][] {
  const path = join(REPO_ROOT, "tests", "data", "conformance", "gemini-cli-content", "sessions.jsonl.gz");
  const lines = gunzipSync(readFileSync(path)).toString("utf8").split("\n").filter((l) => l.length > 0);
  return lines.slice(0, 200).map((line) => (JSON.parse(line) as Session).events.map((e) => (e.k === "text" ? e.text! : null)));
}

function typescript(chunks: readonly (string | null)[]): unknown[] {
  const edge = new ContentEdge();
  const out: unknown[] = [];
  for (const chunk of chunks) {
    if (chunk === null) {
      edge.toolCall();
      continue;
    }
    const wire = encodeEvent(modelTextEvent("oracle", edge, chunk, ORACLE_FIELDS)).toString("utf8");
    out.push({ event: JSON.parse(wire), wire });
  }
  return out;
}

test("the golden content sessions' chunks: the same model.text records in TypeScript and Python", () => {
  const sessions = vectors();
  const python = askPython(sessions.map((chunks) => ({ op: "model_text", chunks })));
  const records = sessions.map((chunks) => typescript(chunks));
  records.forEach((got, i) => assert.deepStrictEqual(got, python[i], `session ${i} differs`));
  const all = records.flat() as { event: { reset: boolean; skipped: boolean; truncated: number } }[];
  assert.ok(all.some((a) => a.event.reset) && all.some((a) => a.event.skipped) && all.some((a) => a.event.truncated > 0));
});

test(`random text cut anywhere: the same model.text records in TypeScript and Python (seed ${SEED})`, () => {
  const unit = fc.constantFrom("a", "b", " ", "\n", "*", "-", "#", "|", "`", "\u00a0", "\ud83d", "\ude00", "\u2028", "1", ".", "A");
  const sessions = fc.sample(fc.array(fc.oneof(fc.array(unit, { maxLength: 300 }).map((u) => u.join("")), fc.constant(null)), { maxLength: 30 }), {
    numRuns: 200,
    seed: SEED,
  });
  const python = askPython(sessions.map((chunks) => ({ op: "model_text", chunks })));
  sessions.forEach((chunks, i) => assert.deepStrictEqual(typescript(chunks), python[i], `session ${i} differs: ${JSON.stringify(chunks)}`));
});

test("a chunk longer than the history completes 4,951 windows and still fits one record", () => {
  const event = modelTextEvent("e", new ContentEdge(), "x".repeat(7000), ORACLE_FIELDS);
  assert.equal(Buffer.from(event.windows, "base64").length, 4951 * 8);
  assert.ok(encodeEvent(event).length <= 64 * 1024);
});
