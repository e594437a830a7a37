/**
 * Profile latest's edge hashing against upstream itself: every call and outcome of the 600
 * golden sessions (tests/data/conformance/latest, upstream OpenClaw 2a627431's own answers),
 * hashed by this package, gives the args hash upstream computed and the record upstream's
 * record_outcome wrote (result hash with envelope ids canonicalised, unknown tool, outcome kind,
 * failure identity, no-progress flag, write target), and every vetoed call's blocked result
 * gives upstream's veto record. Format: openclaw-latest.md §10.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { argsHash, hashOutcome, writeTargetHash, type ToolOutcome } from "../../src/hashing.js";
import { blockedResult } from "../../src/events.js";
import { LATEST_TRACES } from "../support/paths.js";

interface Step {
  op: "call" | "begin" | "end" | "arm";
  tool?: string;
  args?: unknown;
  id?: string;
  slot?: number;
  out?: { result?: unknown; error?: unknown; none?: true };
}

interface Session {
  id: string;
  env?: { provider_send_tools?: string[] };
  steps: Step[];
}

interface Expected {
  s: string;
  i: number;
  ah?: string;
  d?: unknown[];
  b?: boolean;
  vr?: unknown[] | null;
  rec?: unknown[] | null;
  skip?: boolean;
}

function jsonLines<T>(path: string): T[] {
  return gunzipSync(readFileSync(path))
    .toString("utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line) as T);
}

function outcomeOf(out: NonNullable<Step["out"]>): ToolOutcome {
  if (out.none) {
    return { result: undefined };
  }
  if ("error" in out) {
    const error = out.error as { $error?: boolean; name?: string; message?: string };
    if (typeof error === "object" && error !== null && error.$error === true) {
      const thrown = new Error(error.message ?? "");
      thrown.name = error.name ?? "Error";
      return { error: thrown };
    }
    return { error: out.error };
  }
  return { result: out.result };
}

/** The record fields upstream's `rec` (and `vr`) carry that the runner's hashing decides. */
function recordOf(tool: string, args: unknown, outcome: ToolOutcome, sendTools: ReadonlySet<string>): unknown[] | null {
  const o = hashOutcome(tool, args, outcome, sendTools);
  const kind = o.loopVeto ? "tool-loop-veto" : o.outcomeKind;
  const hash = o.normalizedResultHash ?? o.resultHash;
  if (hash === null && kind === null) {
    return null; // record_outcome writes nothing
  }
  return [hash, o.unknownToolName, kind, o.failureIdentityHash, o.noProgress, writeTargetHash(tool, args)];
}

function upstreamRecord(rec: unknown[] | null): unknown[] | null {
  // [argsHash, resultHash, unknownToolName, toolCallId, runId, outcomeKind, failureIdentityHash, noProgress, mutationTargetHash]
  return rec === null ? null : [rec[1], rec[2], rec[5], rec[6], rec[7], rec[8]];
}

test("profile latest: every args hash, outcome record and veto record of the 600 golden sessions is upstream's", () => {
  const sessions = jsonLines<Session>(LATEST_TRACES.sessions);
  const expected = jsonLines<Expected>(LATEST_TRACES.expected);
  assert.equal(sessions.length, 600);
  let line = 0;
  const seen = new Map<string, number>();
  const count = (what: string) => seen.set(what, (seen.get(what) ?? 0) + 1);
  for (const session of sessions) {
    const sendTools = new Set(session.env?.provider_send_tools ?? []);
    const slots = new Map<number, { tool: string; args: unknown }>();
    for (const [i, step] of session.steps.entries()) {
      const want = expected[line++]!;
      assert.deepEqual([want.s, want.i], [session.id, i], "the expected lines are out of step with the sessions");
      const where = `${session.id} step ${i} (${step.op} ${step.tool ?? ""})`;
      let call: { tool: string; args: unknown } | undefined;
      if (step.op === "call" || step.op === "begin") {
        call = { tool: step.tool!, args: "args" in step ? step.args : null };
        assert.equal(argsHash(call.tool, call.args), want.ah, `${where}: args hash`);
        count("args");
        if (step.op === "begin") slots.set(step.slot!, call);
        if (want.b) {
          // The vetoed call is completed with the blocked result: upstream's veto record.
          const veto = recordOf(call.tool, call.args, { result: blockedResult(String(want.d![4])) }, sendTools);
          assert.deepEqual(veto, upstreamRecord(want.vr ?? null), `${where}: veto record`);
          count("veto");
          continue;
        }
      } else if (step.op === "end") {
        call = slots.get(step.slot!);
        if (want.skip) continue;
      }
      if (call === undefined || step.out === undefined) continue;
      assert.ok("rec" in want, `${where}: upstream recorded no outcome`);
      const got = recordOf(call.tool, call.args, outcomeOf(step.out), sendTools);
      assert.deepEqual(got, upstreamRecord(want.rec!), `${where}: outcome record`);
      count("outcome");
      if (got === null) count("no record");
      else {
        if (got[2] !== null) count(String(got[2]));
        if (got[4] === true) count("no progress");
        if (got[5] !== null) count("write target");
        const o = hashOutcome(call.tool, call.args, outcomeOf(step.out), sendTools);
        if (o.normalizedResultHash !== null && o.outcomeKind === null && !o.noProgress) count("envelope ids canonicalised");
      }
    }
  }
  assert.equal(line, expected.length);
  // What the traces exercise (COVERAGE.md there): every rule this package hashes.
  for (const what of ["terminal-exec-failure", "write-mutation", "tool-loop-veto", "no progress", "write target", "envelope ids canonicalised", "no record", "veto"]) {
    assert.ok((seen.get(what) ?? 0) > 0, `the traces never reached ${what}: ${JSON.stringify([...seen])}`);
  }
  assert.ok(seen.get("outcome")! > 60_000, JSON.stringify([...seen]));
});
