"""The Python side of the TypeScript client's cross-language tests.

Reads JSON requests, one per line, on stdin and answers each with one JSON line on stdout,
computed by the project's own Python: ``streams.edge.events`` (which hashes with
``streams.edge.hashing``), ``schemas`` (events, keys, signing) and aiokafka's partitioner.
Values arrive in the transport encoding of test/support/transport.ts, which keeps what
JSON would lose (-0, NaN, undefined, bigint, shared and cyclic references).

Requests:
  {"op": "args", "tool": t, "args": V}
      -> the tool_call.requested event streams.edge.events builds: {"event": {...}, "wire": "<encode_event>"}
  {"op": "outcome", "tool": t, "args": V, "result": V | "error": V, "send_tools": [...]}
      (no "result" and no "error": the tool returned undefined)
      -> the tool_call.completed event, the same way
  {"op": "cases", "path": FILE}  -> every tool call of the conformance vectors, with answers
  {"op": "decode", "wire": "<record value>"}  -> {"wire": re-encoded} or {"invalid": reason, "detail": ...}
  {"op": "sign", "key_id": k, "agent_id": a, "secret": "<hex>", "value": "<hex>"}
      -> {"headers": [[name, value], ...]} (schemas.signing.SigningKey.headers)
  {"op": "parse_keys", "data": "<key file text>"}  -> [[key_id, agent_id, "<secret hex>"], ...] or {"error": message}
  {"op": "state_key", "fields": {...}}
  {"op": "record_key", "fields": {...}}
  {"op": "partition", "key": k, "partitions": n}
  {"op": "peer_args", "tool": t, "args": V, "thought": s | null, "gemini": bool}
      -> the tool_call.requested event with the peer profiles' fields (thought_hash, call_key)
  {"op": "message", "text": s, "source": "agent" | "user"}  -> the agent.message event
  {"op": "model_text", "chunks": [s | null, ...]}  -> the model.text event of each chunk through
      one ContentEdge (null: a tool call, which resets it; no event)

Every event is built with the same ids and fields (``_FIELDS``, event id "oracle", ts_ms 0), so
the TypeScript side builds the same event and compares its record value byte for byte.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import msgspec
from aiokafka.partitioner import murmur2

from schemas.events import UNSET, CompactionRetried, InvalidEvent, decode_event, encode_event
from schemas.keys import record_key, state_key
from schemas.signing import SigningKey, SigningKeyError, parse_keys
from streams.conformance.cases import expand_steps, load_cases, materialize, materialize_args
from streams.edge.canonical import UNDEFINED, TooDeep
from streams.edge.content_windows import ContentEdge
from streams.edge.events import agent_message_event, completed_event, model_text_event, requested_event
from streams.edge.hashing import ThrownError

_FIELDS = dict(run_id="oracle-run", session_key="oracle")
_OUTCOME_OPS = frozenset({"record_outcome", "call", "execute"})


# -- transport ---------------------------------------------------------------------------------


def decode(encoded: Any, thrown: bool = False) -> Any:
    """Transport -> Python. ``thrown``: the value was thrown, so an Error is a ThrownError."""
    by_id: dict[int, Any] = {}

    def walk(e: Any, top: bool) -> Any:
        if e is None or isinstance(e, (bool, str)):
            return e
        if "d" in e:
            return struct.unpack(">d", bytes.fromhex(e["d"]))[0]
        if "b" in e:
            return e["b"]  # upstream prints a bigint as the JSON string of its decimal form
        if "u" in e:
            return UNDEFINED
        if "f" in e:
            return None  # functions and symbols print as null
        if "r" in e:
            return by_id[e["r"]]
        if "e" in e:
            fields = e["e"]
            if top and thrown:
                return ThrownError(message=fields["message"], name=fields["name"])
            return {k: fields[k] if k in fields else UNDEFINED for k in ("name", "message", "stack")}
        if "y" in e:
            return {"type": "Uint8Array", "data": e["y"]}
        if "a" in e:
            out: list = []
            by_id[e["i"]] = out
            out.extend(walk(item, False) for item in e["a"])
            return out
        if "o" in e:
            obj: dict = {}
            by_id[e["i"]] = obj
            for key, item in e["o"]:
                obj[key] = walk(item, False)
            return obj
        raise ValueError(f"unknown transport tag in {e!r}")

    return walk(encoded, True)


def encode(value: Any) -> Any:
    """Python -> transport (for the conformance vectors' values)."""
    ids: dict[int, int] = {}

    def walk(v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if v is UNDEFINED:
            return {"u": 0}
        if isinstance(v, (int, float)):
            try:
                number = float(v)
            except OverflowError:
                number = float("inf") if v > 0 else float("-inf")
            return {"d": struct.pack(">d", number).hex()}
        if isinstance(v, ThrownError):
            return {"e": {"name": v.name, "message": v.message}}
        if id(v) in ids:
            return {"r": ids[id(v)]}
        ids[id(v)] = n = len(ids)
        if isinstance(v, (list, tuple)):
            return {"a": [walk(item) for item in v], "i": n}
        if isinstance(v, dict):
            return {"o": [[k, walk(item)] for k, item in v.items()], "i": n}
        raise TypeError(f"cannot encode {type(v).__name__}")

    return walk(value)


# -- answers -----------------------------------------------------------------------------------


def event_answer(event) -> dict:
    # The TypeScript client leaves the optional near_args_hash unset (its README says so): the
    # event it must match is Python's without it.
    if getattr(event, "near_args_hash", UNSET) is not UNSET:
        event = msgspec.structs.replace(event, near_args_hash=UNSET)
    return {"event": msgspec.to_builtins(event), "wire": encode_event(event).decode("utf-8")}


def args_answer(tool: str, args: Any) -> dict:
    return event_answer(requested_event("oracle", tool, args, **_FIELDS))


def outcome_answer(tool: str, args: Any, outcome: dict, send_tools: list[str]) -> dict:
    kwargs: dict[str, Any] = {"provider_send_tools": send_tools}
    if "error" in outcome:
        kwargs["error"] = outcome["error"]
    elif "result" in outcome:
        kwargs["result"] = outcome["result"]
    else:
        kwargs["returned"] = False
    return event_answer(completed_event("oracle", tool, args, **kwargs, **_FIELDS))


def decode_answer(wire: str) -> dict:
    """A record value through the worker's own decoder (bounds and consistency rules), and
    back out through its encoder."""
    try:
        return {"wire": encode_event(decode_event(wire.encode("utf-8"))).decode("utf-8")}
    except InvalidEvent as exc:
        return {"invalid": exc.reason, "detail": exc.detail}


def keys_answer(data: str) -> Any:
    try:
        return [[k.key_id, k.agent_id, k.secret.hex()] for k in parse_keys(data, "keys.json")]
    except SigningKeyError as exc:
        return {"error": str(exc)}


def case_items(path: str) -> list[dict]:
    """Every tool call the vectors make (args, and the outcome where the step has one)."""
    items = []
    cases = load_cases(path)
    for case in cases:
        send_tools = list((case.get("environment") or {}).get("provider_send_tools") or ())
        for step, _ in expand_steps(case.get("steps") or []):
            calls = [step] if "tool" in step else []
            calls += [dict(item) for item in step.get("items") or () if isinstance(item, dict) and "tool" in item]
            for call in calls:
                args = materialize_args(call.get("args"))
                item: dict[str, Any] = {"case": case["id"], "op": step.get("op"), "tool": call["tool"],
                                        "args": encode(args), "send_tools": send_tools}
                outcome: dict[str, Any] = {}
                if "error" in call:
                    outcome["error"] = materialize(call["error"])
                    item["error"] = encode(outcome["error"])
                elif "result" in call:
                    outcome["result"] = materialize(call["result"])
                    item["result"] = encode(outcome["result"])
                elif step.get("op") not in _OUTCOME_OPS:
                    items.append({**item, "python": args_answer(call["tool"], args)})
                    continue
                item["outcome"] = True  # an outcome step without a result: the tool returned undefined
                items.append({**item, "python": outcome_answer(call["tool"], args, outcome, send_tools)})
    return items


def errors_answer() -> dict:
    """The error classes a Python runner meets (the client's and the config's), each with the
    loopwatch classes it derives from, nearest first."""
    import schemas.config
    import schemas.signing
    import streams.client
    from schemas.errors import LoopwatchError

    classes = [getattr(streams.client, name) for name in streams.client.__all__]
    classes += [schemas.config.ConfigError, schemas.signing.SigningKeyError]
    return {
        cls.__name__: [base.__name__ for base in cls.__mro__[1:] if issubclass(base, LoopwatchError)]
        for cls in classes
        if isinstance(cls, type) and issubclass(cls, LoopwatchError)
    }


def answer(request: dict) -> Any:
    op = request["op"]
    if op == "peer_args":
        args = decode(request["args"])
        return event_answer(requested_event("oracle", request["tool"], args, thought=request.get("thought"),
                                            gemini_key=bool(request.get("gemini")), **_FIELDS))
    if op == "message":
        return event_answer(agent_message_event("oracle", request["text"], source=request["source"], **_FIELDS))
    if op == "model_text":
        edge, out = ContentEdge(), []
        for chunk in request["chunks"]:
            if chunk is None:
                edge.tool_call()
            else:
                out.append(event_answer(model_text_event("oracle", edge, chunk, **_FIELDS)))
        return out
    if op == "args":
        return args_answer(request["tool"], decode(request["args"]))
    if op == "outcome":
        outcome = {}
        if "error" in request:
            outcome["error"] = decode(request["error"], thrown=True)
        elif "result" in request:
            outcome["result"] = decode(request["result"])
        return outcome_answer(request["tool"], decode(request["args"]), outcome, request.get("send_tools") or [])
    if op == "cases":
        return case_items(request["path"])
    if op == "decode":
        return decode_answer(request["wire"])
    if op == "sign":
        key = SigningKey(request["key_id"], request["agent_id"], bytes.fromhex(request["secret"]))
        return {"headers": [[name, value.decode()] for name, value in key.headers(bytes.fromhex(request["value"]))]}
    if op == "parse_keys":
        return keys_answer(request["data"])
    if op == "state_key":
        return state_key(CompactionRetried(event_id="oracle", **request["fields"]))
    if op == "record_key":
        return record_key(CompactionRetried(event_id="oracle", **request["fields"]))
    if op == "partition":
        return (murmur2(request["key"].encode("utf-8", "surrogatepass")) & 0x7FFFFFFF) % request["partitions"]
    if op == "errors":
        return errors_answer()
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = {"ok": answer(json.loads(line))}
        except (RecursionError, TooDeep):
            # TooDeep: nested past JSON_DEPTH_LIMIT, which both clients refuse.  RecursionError:
            # what upstream's JavaScript does too (a RangeError), e.g. on a cycle in a send
            # result, which stripVolatileSendIds walks without a guard.
            reply = {"ok": {"failed": "too-deep"}}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    # The transport doubles the nesting of deep values; json's decoder counts every level.
    sys.setrecursionlimit(10_000)
    main()
