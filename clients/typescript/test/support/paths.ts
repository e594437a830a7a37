/** Where the tests find the repository's files and the Python side. */
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join, resolve } from "node:path";

/** The package root (clients/typescript), from dist/test/support/. */
export const PACKAGE_ROOT = resolve(fileURLToPath(new URL("../../..", import.meta.url)));
/** The loopwatch repository root. */
export const REPO_ROOT = resolve(PACKAGE_ROOT, "..", "..");

export const SCHEMA_DIR = join(REPO_ROOT, "schemas", "jsonschema");

/**
 * The conformance vectors: the repository's own copy of the shared set
 * (tests/data/README.md says where it comes from).
 */
export const CONFORMANCE_CASES = join(REPO_ROOT, "tests", "data", "conformance", "openclaw-cases.json");

/** Profile latest's golden traces: sessions, and upstream's answer for every step (TRACES.md there). */
export const LATEST_TRACES = {
  sessions: join(REPO_ROOT, "tests", "data", "conformance", "latest", "sessions.jsonl.gz"),
  expected: join(REPO_ROOT, "tests", "data", "conformance", "latest", "expected.jsonl.gz"),
};

export function conformanceCasesPath(): string {
  if (!existsSync(CONFORMANCE_CASES)) {
    throw new Error(`the conformance vectors are missing: expected ${CONFORMANCE_CASES}`);
  }
  return CONFORMANCE_CASES;
}

/**
 * The Python that runs `streams/edge/events.py` for the cross-language tests: `$LOOPWATCH_PYTHON`,
 * else the repository's virtualenv (`make install` creates it).
 */
export function pythonExecutable(): string {
  const explicit = process.env.LOOPWATCH_PYTHON;
  if (explicit) {
    return explicit;
  }
  const venv = join(REPO_ROOT, ".venv", "bin", "python");
  if (!existsSync(venv)) {
    throw new Error(`no Python for the cross-language tests: run \`make install\` in ${REPO_ROOT} or set LOOPWATCH_PYTHON`);
  }
  return venv;
}

export const ORACLE_SCRIPT = join(PACKAGE_ROOT, "test", "oracle.py");
