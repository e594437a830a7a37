/**
 * The plugin entry OpenClaw loads (`package.json` → `openclaw.extensions`): the object
 * `definePluginEntry` would build (src/plugin-sdk/plugin-entry.ts), without depending on the
 * `openclaw` package. The config schema is the manifest's, read from `openclaw.plugin.json`.
 */
import { readFileSync } from "node:fs";
import { ConfigError } from "../errors.js";
import { clientOptionsFromConfig } from "./config.js";
import { registerLoopwatch, type OpenClawPluginApi } from "./plugin.js";

export { registerLoopwatch, BEFORE_TOOL_CALL_PRIORITY } from "./plugin.js";
export type * from "./plugin.js";
export { clientOptionsFromConfig, PluginConfigError } from "./config.js";
export { ConfigError } from "../errors.js";

/** `openclaw.plugin.json`, three levels up from dist/src/openclaw/. */
export const MANIFEST_URL = new URL("../../../openclaw.plugin.json", import.meta.url);
const manifest = JSON.parse(readFileSync(MANIFEST_URL, "utf8")) as {
  id: string;
  name: string;
  description: string;
  configSchema: Record<string, unknown>;
};

const plugin = {
  id: manifest.id,
  name: manifest.name,
  description: manifest.description,
  configSchema: {
    jsonSchema: manifest.configSchema,
    validate(value: unknown): { ok: true; value: unknown } | { ok: false; errors: string[] } {
      try {
        clientOptionsFromConfig(value);
        return { ok: true, value };
      } catch (err) {
        if (err instanceof ConfigError) {
          return { ok: false, errors: [err.message] };
        }
        throw err;
      }
    },
  },
  register(api: OpenClawPluginApi): void {
    registerLoopwatch(api);
  },
};

export default plugin;
