/**
 * The runner's side of Gemini CLI's content loop detector (`checkContentLoop` in
 * `@google/gemini-cli-core`'s loopDetectionService.ts), the same as `streams/edge/content_windows.py`:
 * what Gemini does with each chunk of the model's streamed text before it looks for a loop, so
 * that only window hashes leave the runner. In JavaScript the patterns, the string lengths (UTF-16
 * code units) and the hashing of a string (UTF-8, a lone surrogate as U+FFFD) are Gemini's own.
 */
import { createHash } from "node:crypto";

export const CONTENT_WINDOW = 50;
export const CONTENT_HISTORY = 5000;
export const WINDOW_HASH_BYTES = 8;

/** What Gemini did with one chunk: the fields of a `model.text` event. */
export interface ContentWindows {
  reset: boolean;
  skipped: boolean;
  truncated: number;
  length: number;
  /** The windows the chunk completed, 8 bytes each, in order of position. */
  windows: Buffer;
}

/** Gemini's reset patterns, verbatim (loopDetectionService.ts 0.61.0). */
function inspect(content: string): { fences: number; divider: boolean; reset: boolean } {
  const fences = (content.match(/```/g) ?? []).length;
  const hasTable = /(^|\n)\s*(\|.*\||[|+-]{3,})/.test(content);
  const hasListItem = /(^|\n)\s*[*-+]\s/.test(content) || /(^|\n)\s*\d+\.\s/.test(content);
  const hasHeading = /(^|\n)#+\s/.test(content);
  const hasBlockquote = /(^|\n)>\s/.test(content);
  const divider = /^[+-_=*\u2500-\u257F]+$/.test(content);
  return { fences, divider, reset: !!(fences || hasTable || hasListItem || hasHeading || hasBlockquote || divider) };
}

/** Gemini's content tracking for one run, on the runner's side. */
export class ContentEdge {
  /** `streamContentHistory`. */
  private history = "";
  /** `inCodeBlock`: never reset, by a tool call or a new prompt either (as Gemini's). */
  inCodeBlock = false;

  get length(): number {
    return this.history.length;
  }

  /** `resetContentTracking`: on a tool call request and on a new user prompt. */
  reset(): void {
    this.history = "";
  }

  toolCall(): void {
    this.reset();
  }

  userPrompt(): void {
    this.reset();
  }

  /** `checkContentLoop(chunk)` up to its analysis. */
  feed(chunk: string): ContentWindows {
    const { fences, divider, reset } = inspect(chunk);
    if (reset) this.history = "";
    const wasInCodeBlock = this.inCodeBlock;
    if (fences % 2 !== 0) this.inCodeBlock = !this.inCodeBlock;
    if (wasInCodeBlock || this.inCodeBlock || divider) {
      return { reset, skipped: true, truncated: 0, length: this.history.length, windows: Buffer.alloc(0) };
    }
    const before = this.history.length;
    let history = this.history + chunk;
    const truncated = Math.max(0, history.length - CONTENT_HISTORY);
    if (truncated) history = history.slice(truncated);
    this.history = history;
    const first = Math.max(0, before - CONTENT_WINDOW + 1 - truncated);
    const parts: Buffer[] = [];
    for (let p = first; p + CONTENT_WINDOW <= history.length; p += 1) {
      parts.push(createHash("sha256").update(history.substring(p, p + CONTENT_WINDOW)).digest().subarray(0, WINDOW_HASH_BYTES));
    }
    return { reset, skipped: false, truncated, length: history.length, windows: Buffer.concat(parts) };
  }
}
