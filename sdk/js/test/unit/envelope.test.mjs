// Envelopes: the vector envelopes (test/vectors/mailbox-vectors.json is a
// verbatim copy of shared/spec/mailbox-vectors.json), every SealError code
// of opening, and EnvelopeReader against the Go SDK's link.Reader rules
// (the cases of sdk/link/reader_test.go, plus a model check).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import {
  sealEnvelope, openEnvelope, envelopeSequence, EnvelopeReader, SealError,
  ENVELOPE_OVERHEAD, REPLAY_WINDOW,
} from "../../dist/envelope.js";
import { Link } from "../../dist/link.js";
import { hex, fromHex, utf8 } from "../../dist/bytes.js";

const V = JSON.parse(readFileSync(new URL("../vectors/mailbox-vectors.json", import.meta.url), "utf8"));
const vlink = await Link.fromKey(fromHex(V.link_key_hex), V.link_id);

async function rawKey(byte) {
  const k = new Uint8Array(32);
  k[0] = byte;
  return crypto.subtle.importKey("raw", k, "AES-GCM", false, ["encrypt", "decrypt"]);
}
const KEY = await rawKey(7);
const OTHER = await rawKey(8);

test("vectors: both envelopes sealed and opened", async () => {
  assert.equal(V.envelopes.length, 2);
  for (const e of V.envelopes) {
    const key = vlink.envelopeKey(e.direction);
    assert.equal(e.key, `envelope_key_${e.direction}`);
    const env = await sealEnvelope(key, e.seq, fromHex(e.plaintext_hex));
    assert.equal(hex(env), e.envelope_hex);
    assert.equal(env.length, e.length);
    assert.equal(hex(env.subarray(0, 9)), e.aad_hex);
    assert.equal(hex(await sealEnvelope(key, e.seq, e.plaintext)), e.envelope_hex, "string plaintext");
    const opened = await openEnvelope(key, fromHex(e.envelope_hex));
    assert.equal(opened.seq, e.seq);
    assert.equal(hex(opened.plaintext), e.plaintext_hex);
    assert.equal(new TextDecoder().decode(opened.plaintext), e.plaintext);
    assert.equal(envelopeSequence(fromHex(e.envelope_hex)), e.seq);
    // The nonce is 4 zero bytes || the sequence: the one WebCrypto, given
    // it directly, opens the body with.
    const raw = await crypto.subtle.importKey("raw", fromHex(V[`${e.key}_hex`]), "AES-GCM", false, ["decrypt"]);
    const body = fromHex(e.envelope_hex).subarray(9);
    const pt = await crypto.subtle.decrypt({ name: "AES-GCM", iv: fromHex(e.nonce_hex), additionalData: fromHex(e.aad_hex) }, raw, body);
    assert.equal(hex(new Uint8Array(pt)), e.plaintext_hex);
  }
});

test("layout: header, big-endian sequence across 32 bits, 25 bytes overhead", async () => {
  assert.equal(ENVELOPE_OVERHEAD, 25);
  for (const [seq, hdr] of [
    [1, "010000000000000001"],
    [0xffffffff, "0100000000ffffffff"],
    [2 ** 32, "010000000100000000"],
    [2 ** 32 + 5, "010000000100000005"],
    [Number.MAX_SAFE_INTEGER, "01001fffffffffffff"],
  ]) {
    const env = await sealEnvelope(KEY, seq, new Uint8Array(0));
    assert.equal(env.length, 25);
    assert.equal(hex(env.subarray(0, 9)), hdr);
    assert.equal(envelopeSequence(env), seq);
    const o = await openEnvelope(KEY, env);
    assert.equal(o.seq, seq);
    assert.equal(o.plaintext.length, 0);
  }
  const big = new Uint8Array(65536 - 25).map((_, i) => i * 7);
  const env = await sealEnvelope(KEY, 3, big);
  assert.equal(env.length, 65536);
  assert.deepEqual((await openEnvelope(KEY, env)).plaintext, big);
});

test("seal: sequence must be an integer 1..2^53-1 (RangeError)", async () => {
  for (const seq of [0, -1, 1.5, Number.MAX_SAFE_INTEGER + 1, 2 ** 64, NaN, Infinity, "1", 1n, undefined]) {
    await assert.rejects(sealEnvelope(KEY, seq, "x"), RangeError, String(seq));
  }
  await assert.rejects(sealEnvelope(KEY, 1, 42), TypeError);
});

test("open: a view into a larger buffer opens (byteOffset honoured)", async () => {
  const env = await sealEnvelope(KEY, 9, "inside");
  const buf = new Uint8Array(env.length + 10);
  buf.set(env, 5);
  const view = buf.subarray(5, 5 + env.length);
  assert.equal(envelopeSequence(view), 9);
  assert.equal(new TextDecoder().decode((await openEnvelope(KEY, view)).plaintext), "inside");
});

async function code(p) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof SealError, `not a SealError: ${e}`);
    assert.equal(e.name, "SealError");
    assert.ok(e.message.length > 0);
    return e.code;
  }
  return "ok";
}

test("open: malformed (24 bytes, version, sequence 0, above 2^53-1) and bad_tag", async () => {
  const env = await sealEnvelope(KEY, 1, new Uint8Array(0)); // 25 bytes, the smallest
  assert.equal(await code(openEnvelope(KEY, env)), "ok");
  assert.equal(await code(openEnvelope(KEY, env.subarray(0, 24))), "malformed");
  assert.equal(await code(openEnvelope(KEY, new Uint8Array(0))), "malformed");
  const v2 = new Uint8Array(env);
  v2[0] = 2;
  assert.equal(await code(openEnvelope(KEY, v2)), "malformed");
  const v0 = new Uint8Array(env);
  v0[0] = 0;
  assert.equal(await code(openEnvelope(KEY, v0)), "malformed");
  const zero = new Uint8Array(env);
  zero.fill(0, 1, 9);
  assert.equal(await code(openEnvelope(KEY, zero)), "malformed");
  const huge = new Uint8Array(env);
  huge.set([0x00, 0x20, 0, 0, 0, 0, 0, 0], 1); // 2^53
  assert.equal(await code(openEnvelope(KEY, huge)), "malformed");
  assert.throws(() => envelopeSequence(huge), (e) => e instanceof SealError && e.code === "malformed" && /9007199254740992/.test(e.message));
  assert.throws(() => envelopeSequence(zero), { code: "malformed" });
  assert.throws(() => envelopeSequence(v2), { code: "malformed" });
  assert.throws(() => envelopeSequence(env.subarray(0, 24)), { code: "malformed" });
  assert.throws(() => envelopeSequence("x".repeat(30)), { code: "malformed" });
  // Every single changed byte of an envelope fails: header bytes through
  // the AAD and the nonce, body and tag through the tag.
  const full = await sealEnvelope(KEY, 0x0102030405, "some text");
  for (let i = 0; i < full.length; i++) {
    const bad = new Uint8Array(full);
    bad[i] ^= 0x01;
    // Byte 0 is the version; byte 1 set to 0x01 makes the sequence 2^56 and more.
    assert.equal(await code(openEnvelope(KEY, bad)), i <= 1 ? "malformed" : "bad_tag", `byte ${i}`);
  }
  assert.equal(await code(openEnvelope(OTHER, full)), "bad_tag");
  assert.equal(await code(openEnvelope(KEY, full.subarray(0, full.length - 1))), "bad_tag");
});

function accept(r, seq, key = KEY) {
  return sealEnvelope(key, seq, "m").then((env) => code(r.accept(env)));
}

test("reader: in order, replay, the floor follows", async () => {
  const r = new EnvelopeReader(KEY);
  assert.equal(r.floor, 0);
  for (let s = 1; s <= 5; s++) {
    const env = await sealEnvelope(KEY, s, `m${s}`);
    const o = await r.accept(env);
    assert.equal(o.seq, s);
    assert.equal(new TextDecoder().decode(o.plaintext), `m${s}`);
    assert.equal(r.floor, s);
  }
  assert.equal(await accept(r, 1), "replay");
  assert.equal(await accept(r, 5), "replay");
  assert.equal(r.floor, 5);
});

test("reader: out of order (Go's TestReaderOutOfOrder steps)", async () => {
  const r = new EnvelopeReader(KEY);
  for (const [seq, replay, floor] of [
    [1, false, 1], [3, false, 1], [3, true, 1], [2, false, 3], [2, true, 3], [3, true, 3],
    [10, false, 3], [5, false, 3], [4, false, 5], [10, true, 5], [6, false, 6],
  ]) {
    assert.equal(await accept(r, seq), replay ? "replay" : "ok", `seq ${seq}`);
    assert.equal(r.floor, floor, `after ${seq}`);
  }
});

test("reader: resumes from a floor", async () => {
  const r = new EnvelopeReader(KEY, 100);
  assert.equal(r.floor, 100);
  assert.equal(await accept(r, 100), "replay");
  assert.equal(await accept(r, 1), "replay");
  assert.equal(await accept(r, 101), "ok");
  assert.equal(r.floor, 101);
  for (const f of [-1, 1.5, NaN, Number.MAX_SAFE_INTEGER + 1, "0", null]) {
    assert.throws(() => new EnvelopeReader(KEY, f), RangeError, String(f));
  }
  assert.equal(new EnvelopeReader(KEY, Number.MAX_SAFE_INTEGER).floor, Number.MAX_SAFE_INTEGER);
});

test("reader: window edge, exactly 4096 above the floor and 4097 (Go's TestReaderWindow)", async () => {
  const w = REPLAY_WINDOW;
  assert.equal(w, 4096);
  const r = new EnvelopeReader(KEY);
  assert.equal(await accept(r, 1), "ok");
  assert.equal(await accept(r, 1 + w), "ok"); // exactly at the window's top: tracked, floor stays
  assert.equal(r.floor, 1);
  assert.equal(await accept(r, 2 + w), "ok"); // 4097 above the floor 1: the floor moves to 2, and 2 is given up
  assert.equal(r.floor, 2);
  assert.equal(await accept(r, 2), "replay");
  assert.equal(await accept(r, 3 + w + 1), "ok"); // floor 2 -> 4, 3 and 4 given up
  assert.equal(r.floor, 4);
  for (const seq of [3, 4, 1 + w, 2 + w, 4 + w]) assert.equal(await accept(r, seq), "replay", `${seq}`);
  assert.equal(await accept(r, 5), "ok");
  assert.equal(r.floor, 5);
  assert.equal(await accept(r, 3 + w), "ok"); // still inside, never accepted
  // A jump of many windows clears everything and keeps working.
  const far = 10 * w;
  assert.equal(await accept(r, far), "ok");
  assert.equal(r.floor, far - w);
  for (const seq of [far - 1, far - w + 1]) assert.equal(await accept(r, seq), "ok", `${seq}`);
  assert.equal(await accept(r, far), "replay");
  assert.equal(await accept(r, far - w), "replay");
  // Up to the largest sequence: the window moves there too.
  assert.equal(await accept(r, Number.MAX_SAFE_INTEGER), "ok");
  assert.equal(r.floor, Number.MAX_SAFE_INTEGER - w);
  assert.equal(await accept(r, Number.MAX_SAFE_INTEGER), "replay");
});

test("reader: window edge from a fresh reader at floor 0", async () => {
  const w = REPLAY_WINDOW;
  const a = new EnvelopeReader(KEY);
  assert.equal(await accept(a, w), "ok"); // 4096 above 0
  assert.equal(a.floor, 0);
  assert.equal(await accept(a, 1), "ok");
  assert.equal(a.floor, 1);
  const b = new EnvelopeReader(KEY);
  assert.equal(await accept(b, w + 1), "ok"); // 4097 above 0
  assert.equal(b.floor, 1);
  assert.equal(await accept(b, 1), "replay"); // given up
});

test("reader: a failure changes nothing (forged, far ahead, malformed)", async () => {
  const r = new EnvelopeReader(KEY);
  assert.equal(await accept(r, 1, OTHER), "bad_tag");
  assert.equal(await accept(r, 1_000_000, OTHER), "bad_tag");
  assert.equal(r.floor, 0);
  assert.equal(await accept(r, 1), "ok");
  assert.equal(await code(r.accept(new Uint8Array([1, 2]))), "malformed");
  assert.equal(r.floor, 1);
  assert.equal(await accept(r, 2), "ok");
});

test("reader: concurrent accepts of one envelope accept it once", async () => {
  const r = new EnvelopeReader(KEY);
  const env = await sealEnvelope(KEY, 1, "once");
  const results = await Promise.all([1, 2, 3, 4].map(() => code(r.accept(env))));
  assert.deepEqual(results.sort(), ["ok", "replay", "replay", "replay"]);
  assert.equal(r.floor, 1);
});

test("reader: model check against a plain set (random orders with duplicates)", async () => {
  // A small deterministic generator (xorshift32): reproducible failures.
  let x = 12345;
  const rnd = (n) => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x % n;
  };
  const envs = new Map();
  for (let round = 0; round < 10; round++) {
    const r = new EnvelopeReader(KEY);
    const accepted = new Set();
    const n = 1 + rnd(200);
    for (let i = 0; i < 3 * n; i++) {
      const seq = 1 + rnd(n);
      if (!envs.has(seq)) envs.set(seq, await sealEnvelope(KEY, seq, "m"));
      assert.equal(await code(r.accept(envs.get(seq))), accepted.has(seq) ? "replay" : "ok", `round ${round} seq ${seq}`);
      accepted.add(seq);
      let floor = 0;
      while (accepted.has(floor + 1)) floor++;
      assert.equal(r.floor, floor, `round ${round} after ${seq}`);
    }
  }
});

test("SealError carries its code", () => {
  const e = new SealError("stale", "why");
  assert.ok(e instanceof Error);
  assert.equal(e.code, "stale");
  assert.equal(e.message, "why");
  assert.equal(e.name, "SealError");
  assert.deepEqual(utf8("x"), new Uint8Array([0x78]));
});
