// parseAgentFrame reads a line as the endpoints' encoding/json does: keys
// case-insensitive with Go's folding, last duplicate wins, null skipped for
// envelope fields, payload's raw text byte for byte.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseAgentFrame, foldKey } from "../../dist/agentframe.js";

test("plain frame: fields, payload and its raw text", () => {
  const line = '{"type":"ask","instance":"i1","session":"s1","id":"q","seq":7,"trace":"t-1","payload":{"a":[1,2,{"b":"}]"}]}}';
  const f = parseAgentFrame(line);
  assert.deepEqual(f, {
    type: "ask", instance: "i1", session: "s1", id: "q", seq: 7, trace: "t-1",
    payload: { a: [1, 2, { b: "}]" }] }, payloadRaw: '{"a":[1,2,{"b":"}]"}]}', raw: line,
  });
});

test("payloadRaw keeps big numbers, spacing, unicode, escapes and duplicate keys", () => {
  const p = '{ "n" : 123456789012345678901234567890 , "u":"é\\u00e9\\"}", "d":1, "d":2, "x":[ {} , [] ] }';
  const f = parseAgentFrame(`{"type":"t",  "payload" :${p}  }`);
  assert.equal(f.payloadRaw, p);
  assert.equal(f.payload.d, 2);
});

test("scalar and string payloads end where the token ends", () => {
  for (const p of ["-1.5e+3", "true", "false", "null", '"a,}b\\\\"', "[]", "{}", "0"]) {
    const f = parseAgentFrame(`{"payload":${p},"type":"t"}`);
    assert.equal(f.payloadRaw, p, p);
    assert.deepEqual(f.payload, JSON.parse(p));
  }
  const f = parseAgentFrame('{"type":"t","payload":12 }');
  assert.equal(f.payloadRaw, "12");
});

test("keys match case-insensitively with encoding/json's folding; the last duplicate wins", () => {
  const f = parseAgentFrame('{"type":"a","TYPE":"b","\u017Fession":"s","Session":"s2","typ\\u0065":"c","PayLoad":1,"payload":[2]}');
  assert.equal(f.type, "c");
  assert.equal(f.session, "s2");
  assert.equal(f.payloadRaw, "[2]");
  assert.equal(foldKey("\u212Aey"), "key");
  assert.equal(foldKey("Tÿpe"), "Tÿpe"); // no envelope name: unchanged
  // A non-ASCII key that folds to nothing envelope-like is an unknown field.
  const g = parseAgentFrame('{"type":"a","typé":"b"}');
  assert.equal(g.type, "a");
});

test("null leaves an envelope field as it was; a null payload is the payload null", () => {
  const f = parseAgentFrame('{"type":"a","id":"q","type":null,"id":null,"seq":3,"seq":null,"payload":{},"payload":null}');
  assert.equal(f.type, "a");
  assert.equal(f.id, "q");
  assert.equal(f.seq, 3);
  assert.equal(f.payloadRaw, "null");
  assert.equal(f.payload, null);
});

test("empty strings and seq 0 are absent; no payload member means no payload", () => {
  const f = parseAgentFrame('{"type":"a","instance":"","session":"","id":"","re":"","trace":"","seq":0}');
  assert.deepEqual(f, { type: "a", raw: f.raw });
  assert.ok(!("payload" in f) && !("payloadRaw" in f));
});

test("refused: not one object, no type, wrong field types, seq out of range", () => {
  const bad = ['[1]', 'null', '"x"', '{"type":"a"} x', '{"type":"a"', '', '{}', '{"type":""}', '{"type":5}',
    '{"type":"a","id":1}', '{"type":"a","seq":"1"}', '{"type":"a","seq":1.0}', '{"type":"a","seq":-1}',
    '{"type":"a","seq":1e3}', '{"type":"a","session":{}}', '{"type":"a","type":""}'];
  for (const line of bad) assert.throws(() => parseAgentFrame(line), TypeError, line);
  assert.equal(parseAgentFrame('{"type":"a","seq":9007199254740991}').seq, Number.MAX_SAFE_INTEGER);
  assert.throws(() => parseAgentFrame('{"type":"a","seq":9007199254740992}'), RangeError);
});

test("whitespace between every token", () => {
  const f = parseAgentFrame(' \t{ "type" : "a" , "re" :\r\n"r" , "payload" : [ 1 , "]" ] } ');
  assert.equal(f.type, "a");
  assert.equal(f.re, "r");
  assert.equal(f.payloadRaw, '[ 1 , "]" ]');
});
