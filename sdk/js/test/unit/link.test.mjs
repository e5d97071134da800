// Link keys against spec/mailbox-vectors.json, and the link's validation.
//
// test/vectors/mailbox-vectors.json is a verbatim copy of
// shared/spec/mailbox-vectors.json (the spec lives outside the repository;
// sdk/link/testdata/mailbox-vectors.json is the Go SDK's identical copy).
// Do not edit it here: change the spec and copy it again.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Link, deriveRaw, writes, reads, LABELS, KEY_SIZE } from "../../dist/link.js";
import { hex, fromHex, b64url, utf8 } from "../../dist/bytes.js";
import { sealEnvelope, openEnvelope } from "../../dist/envelope.js";

const V = JSON.parse(readFileSync(new URL("../vectors/mailbox-vectors.json", import.meta.url), "utf8"));
const KEY = fromHex(V.link_key_hex);

test("vectors: the salt is the link id's ASCII bytes", () => {
  assert.equal(hex(utf8(V.link_id)), V.salt_hex);
});

test("vectors: the labels are the ones Link uses", () => {
  assert.deepEqual({ ...LABELS }, V.labels);
});

test("vectors: access token, raw and base64url", async () => {
  const raw = await deriveRaw(KEY, V.link_id, V.labels.access);
  assert.equal(hex(raw), V.access_token_raw_hex);
  assert.equal(b64url(raw), V.access_token);
  const l = await Link.fromKey(KEY, V.link_id);
  assert.equal(l.accessToken, V.access_token);
  assert.equal(l.accessToken.length, 43);
  assert.equal(l.id, V.link_id);
});

test("vectors: all four keys", async () => {
  for (const [label, want] of [
    ["p2c", V.envelope_key_p2c_hex],
    ["c2p", V.envelope_key_c2p_hex],
    ["signalP2c", V.signal_key_p2c_hex],
    ["signalC2p", V.signal_key_c2p_hex],
  ]) {
    assert.equal(hex(await deriveRaw(KEY, V.link_id, V.labels[label])), want, label);
  }
});

test("vectors: Link's CryptoKeys are the vector keys (they seal the vector envelopes)", async () => {
  const l = await Link.fromKey(KEY, V.link_id);
  for (const e of V.envelopes) {
    const env = await sealEnvelope(l.envelopeKey(e.direction), e.seq, e.plaintext);
    assert.equal(hex(env), e.envelope_hex, e.direction);
  }
  // The signal keys are the vector's too: a frame under the raw vector key
  // opens under Link.signalKey and not under the other direction's.
  for (const [dir, rawHex, other] of [["p2c", V.signal_key_p2c_hex, "c2p"], ["c2p", V.signal_key_c2p_hex, "p2c"]]) {
    const k = await crypto.subtle.importKey("raw", fromHex(rawHex), "AES-GCM", false, ["encrypt"]);
    const env = await sealEnvelope(k, 7, "signal");
    assert.deepEqual((await openEnvelope(l.signalKey(dir), env)).plaintext, utf8("signal"));
    await assert.rejects(openEnvelope(l.signalKey(other), env), { code: "bad_tag" });
    await assert.rejects(openEnvelope(l.envelopeKey(dir), env), { code: "bad_tag" });
  }
});

test("keys are AES-GCM and non-extractable", async () => {
  const l = await Link.fromKey(KEY, V.link_id);
  for (const k of [l.envelopeKey("p2c"), l.envelopeKey("c2p"), l.signalKey("p2c"), l.signalKey("c2p")]) {
    assert.equal(k.algorithm.name, "AES-GCM");
    assert.equal(k.algorithm.length, 256);
    assert.equal(k.extractable, false);
    assert.deepEqual([...k.usages].sort(), ["decrypt", "encrypt"]);
    await assert.rejects(crypto.subtle.exportKey("raw", k));
  }
  assert.throws(() => l.envelopeKey("x2y"), TypeError);
  assert.throws(() => l.signalKey(undefined), TypeError);
});

test("code: round trip, and the vector link's code", async () => {
  const l = await Link.fromKey(KEY, V.link_id);
  assert.equal(l.toCode(), `${V.link_id}.${b64url(KEY)}`);
  const back = await Link.fromCode(l.toCode());
  assert.equal(back.id, V.link_id);
  assert.equal(back.accessToken, V.access_token);
  assert.equal(back.toCode(), l.toCode());
});

test("code: malformed codes are refused with TypeError", async () => {
  const key = b64url(KEY);
  for (const code of [
    "",
    V.link_id, // no key
    `${V.link_id}.${key}.x`, // two dots
    `${V.link_id}:${key}`,
    `${V.link_id}.${key}=`, // padded
    `${V.link_id}.${key.slice(0, -1)}`, // 31.x bytes
    `${V.link_id}.${key.slice(0, -1)}F`, // non-zero trailing bits
    `${V.link_id}.${b64url(new Uint8Array(31))}`,
    `${V.link_id}.${b64url(new Uint8Array(33))}`,
    `short.${key}`,
    `${V.link_id}!.${key}`,
  ]) {
    await assert.rejects(Link.fromCode(code), TypeError, code);
  }
  await assert.rejects(Link.fromCode(42), TypeError);
});

test("fromKey: key must be 32 bytes, id 16..64 of A-Za-z0-9_-", async () => {
  await assert.rejects(Link.fromKey(new Uint8Array(31), V.link_id), TypeError);
  await assert.rejects(Link.fromKey(new Uint8Array(33), V.link_id), TypeError);
  await assert.rejects(Link.fromKey([...KEY], V.link_id), TypeError);
  await assert.rejects(Link.fromKey(KEY.buffer, V.link_id), TypeError);
  await assert.rejects(deriveRaw(new Uint8Array(16), V.link_id, "x"), TypeError);
  // The id's edges: 16 and 64 characters pass, 15 and 65 do not.
  for (const [id, ok] of [
    ["a".repeat(15), false],
    ["a".repeat(16), true],
    ["Az09_-".padEnd(64, "z"), true],
    ["a".repeat(65), false],
    ["a".repeat(15) + ".", false],
    ["a".repeat(15) + "=", false],
    ["a".repeat(15) + "é", false],
    ["a".repeat(15) + "\n", false],
  ]) {
    if (ok) assert.equal((await Link.fromKey(KEY, id)).id, id);
    else await assert.rejects(Link.fromKey(KEY, id), TypeError, JSON.stringify(id));
  }
  await assert.rejects(Link.fromKey(KEY, 1234567890123456), TypeError);
});

test("fromKey copies the key", async () => {
  const k = new Uint8Array(KEY);
  const l = await Link.fromKey(k, V.link_id);
  k.fill(0);
  assert.equal(l.toCode(), `${V.link_id}.${b64url(KEY)}`);
  assert.equal((await Link.fromCode(l.toCode())).accessToken, V.access_token);
});

test("generate: a random 32-byte key and a 22-character id", async () => {
  const a = await Link.generate();
  const b = await Link.generate();
  assert.match(a.id, /^[A-Za-z0-9_-]{22}$/);
  assert.notEqual(a.id, b.id);
  assert.notEqual(a.accessToken, b.accessToken);
  const [, key] = a.toCode().split(".");
  assert.equal(key.length, 43);
  assert.equal((await Link.fromCode(a.toCode())).accessToken, a.accessToken);
  assert.equal(KEY_SIZE, 32);
});

test("roles: primary writes p2c and reads c2p, the companion the other way", () => {
  assert.equal(writes("primary"), "p2c");
  assert.equal(reads("primary"), "c2p");
  assert.equal(writes("companion"), "c2p");
  assert.equal(reads("companion"), "p2c");
  assert.throws(() => writes("server"), TypeError);
  assert.throws(() => reads("Primary"), TypeError);
});
