/**
 * The `seq` a runner puts on every event it publishes (`schemas/events.py`, `Seq`; the Python
 * client's `streams/edge/sequence.py`). A worker with signed events refuses an event whose
 * `seq` is not above the highest its run applied (`replayed_event`): a replay of the exact
 * signed bytes, however many events after its original, while it is still within the max age.
 *
 * One counter per process, seeded from the wall clock: each number is the larger of the last
 * plus one and the microseconds since the epoch now. Rising for the process, it rises within
 * every run; a restarted publisher that resumes a run starts at its clock, past every number
 * its predecessor drew (unless that one drew more than one a microsecond for longer than the
 * restart took, or the clock stepped back by more). Numbers stay safe integers (2^53 - 1
 * microseconds is the year 2255).
 */
import { performance } from "node:perf_hooks";

/** Wall-clock microseconds since the epoch (`performance.timeOrigin` is the process's start). */
export function nowMicros(): number {
  return Math.floor((performance.timeOrigin + performance.now()) * 1000);
}

/** Strictly increasing numbers, each at least `clock()` (microseconds since the epoch). */
export class SeqCounter {
  last = -1;

  constructor(readonly clock: () => number = nowMicros) {}

  next(): number {
    const now = this.clock();
    const seq = Math.max(this.last + 1, now);
    if (!Number.isSafeInteger(seq)) {
      throw new RangeError(`seq ${seq} is not a safe integer (the schema's bound is 2^53 - 1)`);
    }
    this.last = seq;
    return seq;
  }
}

const processCounter = new SeqCounter();

/** The process's next `seq`: every client of a process draws from one counter. */
export function nextSeq(): number {
  return processCounter.next();
}

/**
 * `event` with the process's next `seq` as its last field (where the Python Structs have it,
 * so both clients encode an event alike); an event that has one already is returned as it is.
 */
export function numbered<T extends { seq?: number }>(event: T): T {
  return event.seq === undefined ? { ...event, seq: nextSeq() } : event;
}
