/**
 * The OpenClaw plugin without a broker: its manifest and entry as OpenClaw loads them, the
 * hooks it registers (names and shapes pinned to OpenClaw's own source), its config, and what
 * it returns to the host when loopwatch cannot be reached. Only the plugin API object is
 * faked (test/support/fake-openclaw.ts); Kafka never is (its broker here refuses or never
 * answers). The hooks' behaviour with a real broker and worker is in
 * tests/integration/test_typescript_client.py.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import Ajv from "ajv";
import { clientOptionsFromConfig, PluginConfigError } from "../../src/openclaw/config.js";
import { ConfigError } from "../../src/errors.js";
import { registerLoopwatch, BEFORE_TOOL_CALL_PRIORITY } from "../../src/openclaw/plugin.js";
import { FakeOpenClaw, OPENCLAW_HOOK_NAMES } from "../support/fake-openclaw.js";
import { refusingBroker, silentBroker } from "../support/offline.js";
import { PACKAGE_ROOT } from "../support/paths.js";

const LIMIT = { timeout: 30_000 };
const manifest = JSON.parse(readFileSync(join(PACKAGE_ROOT, "openclaw.plugin.json"), "utf8"));
const packageJson = JSON.parse(readFileSync(join(PACKAGE_ROOT, "package.json"), "utf8"));
const ajv = new Ajv.default({ strict: false, allErrors: true });

/** A key file in the workers' format holding these (key id, agent id) keys. */
function keyFile(...keys: [string, string][]): string {
  const path = join(mkdtempSync(join(tmpdir(), "lw-plugin-keys-")), "keys.json");
  writeFileSync(path, JSON.stringify(keys.map(([key_id, agent_id]) => ({ key_id, agent_id, secret: randomBytes(32).toString("base64") }))));
  return path;
}
const KEYS = keyFile(["main-1", "main"], ["billing-1", "billing"]);
const ROTATING = keyFile(["main-1", "main"], ["main-2", "main"]);

test("the manifest is what OpenClaw requires: id, an inline JSON Schema, activation and contracts", () => {
  assert.equal(manifest.id, "loopwatch");
  assert.equal(manifest.configSchema.type, "object");
  assert.equal(manifest.configSchema.additionalProperties, false);
  ajv.compile(manifest.configSchema); // a valid JSON Schema
  assert.equal(manifest.activation.onStartup, true);
  assert.deepEqual(manifest.activation.onCapabilities, ["hook"]);
  // an installed plugin may register tool-result middleware only for the runtimes it declares
  assert.deepEqual(manifest.contracts.agentToolResultMiddleware, ["openclaw"]);
  assert.equal(manifest.version, packageJson.version);
});

test("package.json points OpenClaw at a built entry whose default export is the plugin", async () => {
  const [entry] = packageJson.openclaw.extensions as string[];
  const file = join(PACKAGE_ROOT, entry!);
  assert.ok(existsSync(file), `${entry} is not built`);
  const plugin = (await import(pathToFileURL(file).href)).default;
  assert.equal(plugin.id, manifest.id);
  assert.equal(plugin.name, manifest.name);
  assert.equal(typeof plugin.register, "function");
  assert.deepEqual(plugin.configSchema.jsonSchema, manifest.configSchema);
  assert.deepEqual(plugin.configSchema.validate({ brokers: ["k:9092"] }), { ok: true, value: { brokers: ["k:9092"] } });
  assert.deepEqual(plugin.configSchema.validate({ brokers: [] }), { ok: false, errors: ["loopwatch plugin config: brokers must be a non-empty list of host:port"] });
});

test("the config parser accepts and refuses what the manifest's schema does", () => {
  const validate = ajv.compile(manifest.configSchema);
  const accepted = [
    { brokers: ["a:1"] },
    { brokers: ["a:1", "b:2"], mode: "advisory", timeoutMs: 250, failClosed: true, providerSendTools: ["telegram"] },
    { brokers: ["a:1"], toolCallsTopic: "tc", verdictsTopic: "lv", clientId: "runner-7", connectTimeoutMs: 100, startTimeoutMs: 100 },
    { brokers: ["a:1"], tls: { enabled: false } },
    { brokers: ["a:1"], tls: { servername: "kafka.example", rejectUnauthorized: false } },
    { brokers: ["a:1"], sasl: { mechanism: "SCRAM-SHA-512", username: "u", password: "p" } },
    { brokers: ["a:1"], sasl: { mechanism: "OAUTHBEARER", token: "t" } },
    { brokers: ["a:1"], groupIdPrefix: "runner-team-a-" },
    { brokers: ["a:1"], signing: { keyFile: KEYS } },
    { brokers: ["a:1"], signing: { keyFile: ROTATING, keyId: "main-2" } },
  ];
  const refused = [
    undefined, {}, { brokers: [] }, { brokers: "a:1" }, { brokers: [""] }, { brokers: ["a:1"], mode: "block" },
    { brokers: ["a:1"], timeoutMs: 0 }, { brokers: ["a:1"], timeoutMs: 1.5 }, { brokers: ["a:1"], timeoutMs: 600_001 },
    { brokers: ["a:1"], failClosed: "yes" }, { brokers: ["a:1"], extra: 1 }, { brokers: ["a:1"], tls: { ca: "x" } },
    { brokers: ["a:1"], sasl: { mechanism: "GSSAPI" } }, { brokers: ["a:1"], sasl: { username: "u" } },
    { brokers: ["a:1"], providerSendTools: [""] },
    { brokers: ["a:1"], groupIdPrefix: "" }, { brokers: ["a:1"], signing: {} }, { brokers: ["a:1"], signing: { keyFile: "" } },
    { brokers: ["a:1"], signing: { keyFile: KEYS, secret: "x" } },
  ];
  for (const config of accepted) {
    assert.ok(validate(config), `schema refused ${JSON.stringify(config)}`);
    assert.doesNotThrow(() => clientOptionsFromConfig(config, {}), JSON.stringify(config));
  }
  for (const config of refused) {
    assert.equal(validate(config), false, `schema accepted ${JSON.stringify(config)}`);
    assert.throws(() => clientOptionsFromConfig(config, {}), ConfigError, JSON.stringify(config));
    assert.throws(() => clientOptionsFromConfig(config, {}), PluginConfigError, JSON.stringify(config)); // the deprecated alias
  }
  // Stricter than the schema can say: credentials must be complete and readable.
  assert.throws(() => clientOptionsFromConfig({ brokers: ["a:1"], sasl: { mechanism: "PLAIN", username: "u" } }, {}), /needs username and password/);
  assert.throws(() => clientOptionsFromConfig({ brokers: ["a:1"], sasl: { mechanism: "PLAIN", username: "u", passwordEnv: "LW_PW" } }, {}), /LW_PW, which is not set/);
  assert.equal(clientOptionsFromConfig({ brokers: ["a:1"], sasl: { mechanism: "PLAIN", username: "u", passwordEnv: "LW_PW" } }, { LW_PW: "s3cret" }).sasl?.password, "s3cret");
  assert.throws(() => clientOptionsFromConfig({ brokers: ["a:1"], tls: { caFile: "/nonexistent/ca.pem" } }, {}), /tls.caFile cannot be read \(ENOENT\)/);
  assert.throws(() => clientOptionsFromConfig({ brokers: ["a:1"], tls: { certFile: fileOf(import.meta.url) } }, {}), /needs both certFile and keyFile/);
  // signing keys: the file must load, name the key asked for, and give each agent one key
  const keys = (config: Record<string, unknown>) => {
    const key = clientOptionsFromConfig({ brokers: ["a:1"], signing: config }, {}).signingKey;
    return (Array.isArray(key) ? key : [key]).map((k) => `${k.keyId}/${k.agentId}`);
  };
  assert.deepEqual(keys({ keyFile: KEYS }), ["main-1/main", "billing-1/billing"]);
  assert.deepEqual(keys({ keyFile: ROTATING, keyId: "main-2" }), ["main-2/main"]);
  assert.throws(() => keys({ keyFile: ROTATING }), {
    message: `loopwatch plugin config: signing ${ROTATING} holds keys main-1 and main-2 of agent "main": name the one to sign with in signing.keyId`,
  });
  assert.throws(() => keys({ keyFile: KEYS, keyId: "main-9" }), { message: `loopwatch plugin config: signing.keyId main-9 is not a key of ${KEYS}` });
  assert.throws(() => keys({ keyFile: "/nonexistent/keys.json" }), { message: "loopwatch plugin config: signing.keyFile /nonexistent/keys.json: cannot read (ENOENT)" });
  const broken = join(mkdtempSync(join(tmpdir(), "lw-plugin-keys-")), "keys.json");
  writeFileSync(broken, JSON.stringify({ key_id: "main-1", agent_id: "main", secret: "c2hvcnQ=" }));
  assert.throws(() => keys({ keyFile: broken }), { message: `loopwatch plugin config: signing.keyFile ${broken}: key main-1: the secret must be at least 32 bytes` });
});

test("a plugin signing for some agents leaves other agents' calls alone (or blocks them, failing closed), warning once", LIMIT, async () => {
  const broker = await refusingBroker();
  for (const failClosed of [false, true]) {
    const api = new FakeOpenClaw({ brokers: [broker.address], timeoutMs: 60_000, failClosed, signing: { keyFile: KEYS, keyId: "main-1" } });
    const plugin = registerLoopwatch(api);
    const ctx = { runId: "run-9", sessionKey: "agent:ops:9", agentId: "ops", toolName: "read", toolCallId: "c1" };
    const results = [];
    for (let n = 0; n < 3; n += 1) {
      results.push(await api.emit("before_tool_call", { toolName: "read", params: {}, runId: "run-9", toolCallId: `c${n}` }, ctx));
    }
    assert.equal(await api.emit("after_tool_call", { toolName: "read", params: {}, toolCallId: "c1", result: {} }, ctx), undefined);
    const reason = 'this client signs with key main-1 of agent "main"; a run of agent "ops" needs that agent\'s key';
    assert.deepEqual(results, Array(3).fill(failClosed ? { block: true, blockReason: `Tool call blocked: ${reason}` } : undefined));
    assert.deepEqual(api.warnings().filter((w) => w.includes("needs that agent's key")), [
      `loopwatch: ${reason}; this agent's tool calls are ${failClosed ? "blocked" : "not watched"}`,
    ]);
    await plugin.stop();
  }
  await broker.close();
});

function fileOf(url: string): string {
  return fileURLToPath(url);
}

test("register: the hooks OpenClaw knows, before_tool_call first, middleware and a service", LIMIT, async () => {
  const broker = await refusingBroker();
  const api = new FakeOpenClaw({ brokers: [broker.address], startTimeoutMs: 200 });
  const plugin = registerLoopwatch(api);
  const names = api.hooks.map((h) => h.hookName);
  assert.deepEqual(names, ["before_tool_call", "after_tool_call", "after_compaction", "agent_end"]);
  for (const name of names) {
    assert.ok((OPENCLAW_HOOK_NAMES as readonly string[]).includes(name), `${name} is not an OpenClaw hook`);
  }
  assert.equal(api.hooks[0]!.opts?.priority, BEFORE_TOOL_CALL_PRIORITY);
  assert.equal(api.middleware.length, 1);
  assert.deepEqual(api.middleware[0]!.options, { runtimes: manifest.contracts.agentToolResultMiddleware });
  assert.deepEqual(api.services.map((s) => s.id), ["loopwatch-client"]);
  await plugin.stop();
});

test("a bad config fails registration with one clear line", () => {
  const api = new FakeOpenClaw({ brokers: ["a:1"], mode: "sometimes" });
  assert.throws(() => registerLoopwatch(api), { name: "ConfigError", message: "loopwatch plugin config: mode must be gate or advisory" });
  assert.equal(api.hooks.length, 0);
});

for (const [kind, makeBroker] of [["refused", refusingBroker], ["silent", silentBroker]] as const) {
  test(`${kind} broker: before_tool_call fails open, after_tool_call never throws`, LIMIT, async () => {
    const broker = await makeBroker();
    const api = new FakeOpenClaw({ brokers: [broker.address], timeoutMs: 300, startTimeoutMs: 500, connectTimeoutMs: 300 });
    const plugin = registerLoopwatch(api);
    const ctx = { runId: "run-1", sessionKey: "agent:main:1", agentId: "main", toolName: "read", toolCallId: "c1" };
    assert.equal(await api.emit("before_tool_call", { toolName: "read", params: { path: "/x" }, runId: "run-1", toolCallId: "c1" }, ctx), undefined);
    assert.equal(await api.emit("after_tool_call", { toolName: "read", params: { path: "/x" }, toolCallId: "c1", result: { content: [] } }, ctx), undefined);
    assert.equal(await api.emit("after_compaction", { messageCount: 3, compactedCount: 10 }, ctx), undefined);
    assert.equal(await api.emit("agent_end", { messages: [], success: true }, ctx), undefined);
    assert.match(api.warnings().join("\n"), /failing open/);
    await plugin.stop();
    await broker.close();
  });

  test(`${kind} broker, failClosed: before_tool_call blocks with a clear reason`, LIMIT, async () => {
    const broker = await makeBroker();
    const api = new FakeOpenClaw({ brokers: [broker.address], timeoutMs: 300, startTimeoutMs: 500, connectTimeoutMs: 300, failClosed: true });
    const plugin = registerLoopwatch(api);
    const ctx = { runId: "run-1", sessionKey: "agent:main:1", toolName: "read" };
    const result = (await api.emit("before_tool_call", { toolName: "read", params: {} }, ctx)) as { block: boolean; blockReason: string };
    assert.equal(result.block, true);
    assert.match(result.blockReason, /^Tool call blocked: loopwatch loop protection is unavailable \(no answer from loopwatch within 300 ms/);
    await plugin.stop();
    await broker.close();
  });
}

test("calls that cannot be hashed: fail open with a warning, or blocked when failing closed", LIMIT, async () => {
  const broker = await refusingBroker();
  const ctx = { runId: "run-1", sessionKey: "s", toolName: "read" };
  const params = { get path(): never { throw new Error("unreadable"); } };
  for (const failClosed of [false, true]) {
    const api = new FakeOpenClaw({ brokers: [broker.address], timeoutMs: 60_000, failClosed });
    const plugin = registerLoopwatch(api);
    const result = await api.emit("before_tool_call", { toolName: "read", params }, ctx);
    if (failClosed) {
      assert.deepEqual(result, { block: true, blockReason: 'Tool call blocked: cannot hash the arguments of tool "read": unreadable' });
    } else {
      assert.equal(result, undefined);
      assert.match(api.warnings().join("\n"), /cannot hash the arguments of tool "read": unreadable/);
    }
    await plugin.stop();
  }
});

test("a call with no run, session key or session id is left alone (nothing to scope it by)", LIMIT, async () => {
  const broker = await silentBroker();
  const api = new FakeOpenClaw({ brokers: [broker.address], timeoutMs: 60_000, failClosed: true });
  const plugin = registerLoopwatch(api);
  assert.equal(await api.emit("before_tool_call", { toolName: "read", params: {} }, { toolName: "read" }), undefined);
  await plugin.stop();
  await broker.close();
});
