/** Ask the Python oracle (test/oracle.py, the project's own streams/edge/events.py) in one batch. */
import { spawnSync } from "node:child_process";
import { ORACLE_SCRIPT, REPO_ROOT, pythonExecutable } from "./paths.js";

export function askPython(requests: readonly object[]): unknown[] {
  const input = requests.map((r) => JSON.stringify(r)).join("\n") + "\n";
  const run = spawnSync(pythonExecutable(), [ORACLE_SCRIPT], {
    cwd: REPO_ROOT,
    input,
    encoding: "utf8",
    maxBuffer: 1 << 30,
  });
  if (run.error) {
    throw run.error;
  }
  if (run.status !== 0) {
    throw new Error(`the Python oracle exited with ${run.status}:\n${run.stderr}`);
  }
  const lines = run.stdout.split("\n").filter((line) => line.length > 0);
  if (lines.length !== requests.length) {
    throw new Error(`asked ${requests.length} questions, the oracle answered ${lines.length}:\n${run.stderr}`);
  }
  return lines.map((line, i) => {
    const reply = JSON.parse(line) as { ok?: unknown; error?: string };
    if (reply.error !== undefined) {
      throw new Error(`the oracle failed on request ${i} (${JSON.stringify(requests[i]).slice(0, 300)}): ${reply.error}`);
    }
    return reply.ok;
  });
}
