// Gemini CLI's own LoopDetectionService (@google/gemini-cli-core) as the oracle of profile
// gemini-cli.  Usage: node gemini_oracle.mjs CORE_DIR SESSIONS > ANSWERS
//   CORE_DIR: the installed package (make oracle-gemini: $(ORACLES)/gemini/node_modules/@google/gemini-cli-core)
//   SESSIONS: JSONL (optionally .gz), one session per line (tests/data/conformance/gemini-cli/TRACES.md)
// Prints one line per session: {"id", "steps"}, the answer at each event.
//
// Only the config object is stubbed (loop detection on; every other getter, the telemetry's,
// answers undefined).  The events are driven as GeminiClient.sendMessageStream drives them: a
// user prompt is a new prompt id (reset); each tool call request goes through addAndCheck; on
// the first detection (count 1) the client breaks the stream before the call runs, clears the
// detection and sends its feedback (_recoverFromLoop); on the second (count 2) it yields
// LoopDetected and ends the turn.  The session then ends.  A chunk of the model's text
// (`text`) is a Content event through addAndCheck, with the same answers to a detection: on
// the first the client breaks the stream and sends its feedback in a new turn of the same
// prompt id (no reset: the content tracking goes on), on the second the turn ends.
import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { pathToFileURL } from 'node:url';

const [coreDir, sessionsPath] = process.argv.slice(2);
const src = pathToFileURL(`${coreDir}/dist/src/`).href;
const { LoopDetectionService } = await import(`${src}services/loopDetectionService.js`);
const { GeminiEventType } = await import(`${src}core/turn.js`);

const config = new Proxy(
  { getDisableLoopDetection: () => false },
  { get: (target, name) => (name in target ? target[name] : () => undefined) },
);

function answer(session) {
  const service = new LoopDetectionService({ config });
  let prompt = 0;
  service.reset(`${session.id}#${prompt}`, '');
  const steps = [];
  for (const e of session.events) {
    if (e.k === 'user') {
      prompt += 1;
      service.reset(`${session.id}#${prompt}`, e.text);
      steps.push(null);
    } else if (e.k === 'call' || e.k === 'text') {
      const event = e.k === 'call'
        ? {
            type: GeminiEventType.ToolCallRequest,
            value: { callId: e.id, name: e.tool, args: e.args, isClientInitiated: false, prompt_id: `${session.id}#${prompt}` },
          }
        // A chunk of the model's streamed text, as Turn.run yields it: a Content event.
        : { type: GeminiEventType.Content, value: e.text };
      const result = service.addAndCheck(event);
      if (result.count > 1) {
        steps.push(['abort', result.type]);
      } else if (result.count === 1) {
        service.clearDetection();
        steps.push(['feedback', result.type]);
      } else {
        steps.push(['allow', null]);
      }
    } else {
      throw new Error(`unknown event kind ${e.k}`);
    }
  }
  return steps;
}

let text = readFileSync(sessionsPath);
if (sessionsPath.endsWith('.gz')) text = gunzipSync(text);
for (const line of text.toString('utf8').split('\n')) {
  if (!line.trim()) continue;
  const session = JSON.parse(line);
  process.stdout.write(`${JSON.stringify({ id: session.id, steps: answer(session) })}\n`);
}
