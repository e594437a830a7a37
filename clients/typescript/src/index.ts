export { stableStringify, digest, isPlainObject, sha256Hex, type Normalizer } from "./canonical.js";
export {
  argsHash,
  canonicalizeUntrustedEnvelopes,
  failureShape,
  geminiCallKey,
  hashOutcome,
  isKnownPoll,
  isSendCall,
  stripVolatileSendIds,
  textHash,
  unknownToolName,
  writeTargetHash,
  type Outcome,
  type OutcomeKind,
  type ToolOutcome,
} from "./hashing.js";
export {
  blockedResult,
  compactionEvent,
  completedEvent,
  agentMessageEvent,
  completedFromOutcome,
  encodeEvent,
  eventKey,
  modelTextEvent,
  requestedEvent,
  runEndedEvent,
  stateKey,
  MAX_EVENT_BYTES,
  type AgentMessage,
  type CompactionRetried,
  type ModelText,
  type RunEnded,
  type RunFields,
  type ToolCallCompleted,
  type ToolCallEvent,
  type ToolCallRequested,
} from "./events.js";
export { decodeVerdict, type Decision, type RunAborted, type Verdict } from "./verdicts.js";
export {
  BrokerAccessError,
  ConfigError,
  LoopBlocked,
  LoopwatchError,
  LoopwatchInputError,
  LoopwatchUnavailable,
  LoopwatchUnavailableError, // deprecated: the old name of LoopwatchUnavailable, NoDecisionError, BrokerAccessError (instanceof holds)
  NoDecisionError,
  PostCompactionLoopPersistedError,
  RunAbortedError,
} from "./errors.js";
export { LoopwatchClient, RunHandle, type ClientOptions, type Logger, type RunIdentity } from "./client.js";
export type { KafkaSettings, SaslSettings } from "./kafka.js";
export {
  KEY_ID_HEADER,
  MIN_SECRET_BYTES,
  SIGNATURE_HEADER,
  SigningKey,
  SigningKeyError,
  loadKeys,
  parseKeys,
} from "./signing.js";
export { ContentEdge, type ContentWindows } from "./geminiContent.js";
export { SeqCounter, nextSeq, nowMicros, numbered } from "./sequence.js";
