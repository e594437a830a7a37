/**
 * Never silently off: a decision whose `detection_off` says the worker's config checks nothing
 * for the agent marks the run (`RunHandle.detectionOff`) and logs one warning per agent and
 * client, as the Python client does. The verdicts are the Python side's own encoding
 * (`schemas.verdicts.encode_verdict`), read with the client's decoder, and routed as the
 * verdict reader routes them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { LoopwatchClient } from "../../src/client.js";
import { stateKey } from "../../src/events.js";
import { decodeVerdict, type Decision } from "../../src/verdicts.js";
import { REPO_ROOT, pythonExecutable } from "../support/paths.js";
import { captureLog } from "../support/offline.js";

/** Allow decisions as the worker encodes them: one per (verdict id, run, agent, detection_off). */
function pythonVerdicts(specs: [string, string, string, boolean][]): Uint8Array[] {
  const script = [
    "import json, sys",
    "from schemas.verdicts import Decision, encode_verdict",
    "for vid, run, agent, off in json.loads(sys.argv[1]):",
    "    extra = {'detection_off': True} if off else {}",
    "    d = Decision(verdict_id=vid, cause_event_id='e-' + vid, run_id=run, session_key='s-' + run,",
    "                 agent_id=agent, tool_name='read', args_hash='a' * 64, action='allow', **extra)",
    "    print(encode_verdict(d).decode())",
  ].join("\n");
  const out = execFileSync(pythonExecutable(), ["-c", script, JSON.stringify(specs)], {
    cwd: REPO_ROOT,
    env: { ...process.env, PYTHONPATH: REPO_ROOT },
    encoding: "utf8",
  });
  return out.trim().split("\n").map((line) => Buffer.from(line, "utf8"));
}

function decision(value: Uint8Array): Decision {
  const verdict = decodeVerdict(value);
  assert.ok(verdict !== null && verdict.type === "loop.decision");
  return verdict;
}

test("detection_off is read from the worker's verdicts, absent meaning on", () => {
  const [off, on] = pythonVerdicts([
    ["v1", "r1", "main", true],
    ["v2", "r1", "main", false],
  ]);
  assert.equal(decision(off!).detection_off, true);
  assert.equal(decision(on!).detection_off, undefined);
});

test("one warning per agent whose decisions say detection is off", () => {
  const log = captureLog();
  const client = new LoopwatchClient({ brokers: ["127.0.0.1:9"], logger: log.logger });
  const runs = [
    client.run({ runId: "r1", sessionKey: "s-r1", agentId: "main" }),
    client.run({ runId: "r2", sessionKey: "s-r2", agentId: "main" }),
    client.run({ runId: "r3", sessionKey: "s-r3", agentId: "billing" }),
    client.run({ runId: "r4", sessionKey: "s-r4", agentId: "checked" }),
  ];
  const verdicts = pythonVerdicts([
    ["v1", "r1", "main", true],
    ["v2", "r1", "main", true],
    ["v3", "r2", "main", true],
    ["v4", "r3", "billing", true],
    ["v5", "r4", "checked", false],
  ]);
  for (const value of verdicts) {
    const d = decision(value);
    client.dispatch(d, stateKey({ ...d, session_id: null }));
  }
  assert.deepEqual(
    runs.map((r) => r.detectionOff),
    [true, true, true, false],
  );
  const hint =
    "its calls are allowed without a check (start the worker with --config examples/getting-started.yaml, " +
    "or set tools.loopDetection.enabled: true in its config; loopwatch config check shows it)";
  assert.deepEqual(log.warnings, [`loopwatch detection is OFF for agent main: ${hint}`, `loopwatch detection is OFF for agent billing: ${hint}`]);
});
