// The JS half of the Go <-> JS cross-check (e2e/cross_test.go runs it as
// `node test/node/cross.mjs <in.json> <out.json>`). It opens what the Go SDK
// sealed and must give, item by item, the verdict Go's Reader and
// SignalReceiver gave (and the same reader floor); then it seals its own
// envelopes and signal frames for Go to open. Any mismatch throws: a
// non-zero exit fails the Go test with this program's output.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { Link } from "../../dist/link.js";
import { EnvelopeReader, SealError, openEnvelope, sealEnvelope } from "../../dist/envelope.js";
import { SignalOpener, SignalSealer } from "../../dist/signalseal.js";
import { fromHex, hex } from "../../dist/bytes.js";

const [inPath, outPath] = process.argv.slice(2);
if (!inPath || !outPath) throw new Error("usage: node test/node/cross.mjs <in.json> <out.json>");
const input = JSON.parse(readFileSync(inPath, "utf8"));

/** The SealError code of p, "ok" when it resolves; anything but a SealError is a failure. */
async function verdict(p) {
  try {
    return { code: "ok", value: await p };
  } catch (e) {
    if (!(e instanceof SealError)) throw e;
    return { code: e.code };
  }
}

// The link, and the token Go derived from it.
const link = await Link.fromCode(input.code);
assert.equal(link.toCode(), input.code, "toCode of Go's code");
assert.equal(link.accessToken, input.accessToken, "access token");

// Envelopes (p2c): one reader, fed in Go's order, must agree with Go's
// Reader on every verdict and floor.
const reader = new EnvelopeReader(link.envelopeKey("p2c"));
for (const [i, item] of input.envelopes.entries()) {
  const env = fromHex(item.hex);
  const got = await verdict(reader.accept(env));
  assert.equal(got.code, item.expect, `envelope ${i} (seq ${item.seq}): JS ${got.code}, Go ${item.expect}`);
  assert.equal(reader.floor, item.floor, `envelope ${i} (seq ${item.seq}): floor`);
  if (item.expect === "ok" || item.expect === "replay") {
    // Genuine: it opens on its own, and JS seals it to the same bytes.
    const o = got.value ?? (await openEnvelope(link.envelopeKey("p2c"), env));
    assert.equal(o.seq, item.seq, `envelope ${i}: seq`);
    assert.equal(hex(o.plaintext), item.plaintext_hex, `envelope ${i}: plaintext`);
    assert.equal(hex(await sealEnvelope(link.envelopeKey("p2c"), item.seq, fromHex(item.plaintext_hex))), item.hex, `envelope ${i}: JS sealing differs`);
  }
}
// Every single-byte change of Go's first envelope fails (the version byte
// and the top sequence byte as malformed, the rest as bad_tag).
{
  const first = fromHex(input.envelopes[0].hex);
  for (let b = 0; b < first.length; b++) {
    const bad = new Uint8Array(first);
    bad[b] ^= 0x01;
    const got = await verdict(openEnvelope(link.envelopeKey("p2c"), bad));
    assert.ok(got.code === "bad_tag" || got.code === "malformed", `Go envelope 0 with byte ${b} changed: ${got.code}`);
  }
}

// Signal frames (p2c): a fresh opener per stream, on the real clock.
for (const [s, stream] of input.signals.entries()) {
  const opener = new SignalOpener(link.signalKey("p2c"));
  for (const [i, item] of stream.entries()) {
    const got = await verdict(opener.open(fromHex(item.hex)));
    assert.equal(got.code, item.expect, `signal stream ${s} frame ${i} (counter ${item.seq}): JS ${got.code}, Go ${item.expect}`);
    if (got.code === "ok") {
      assert.equal(hex(got.value), item.plaintext_hex, `signal stream ${s} frame ${i}: plaintext`);
      assert.equal(opener.last, item.seq, `signal stream ${s} frame ${i}: last`);
    }
  }
}

// What JS seals for Go (c2p): several sequences, empty and 64 KiB envelopes,
// both 32-bit halves of the header, the largest sequence.
const big = crypto.getRandomValues(new Uint8Array(65536 - 25));
const plain = [
  [1, new TextEncoder().encode("hello from js")],
  [2, new Uint8Array(0)],
  [3, big],
  [2 ** 32, new TextEncoder().encode("2^32")],
  [2 ** 32 + 1, big.subarray(0, 4096)],
  [Number.MAX_SAFE_INTEGER, new TextEncoder().encode("max safe")],
];
const envelopes = [];
for (const [seq, pt] of plain) {
  envelopes.push({ seq, hex: hex(await sealEnvelope(link.envelopeKey("c2p"), seq, pt)), plaintext_hex: hex(pt) });
}

// Signal frames (c2p) on the real clock, sealed back to back: several share
// a millisecond, so the counter's last + 1 rule is exercised too.
const sealer = new SignalSealer(link.signalKey("c2p"));
const signals = [];
for (const pt of ["offer", "candidate", "", "x".repeat(1000), "answer"].map((s) => new TextEncoder().encode(s))) {
  const frame = await sealer.seal(pt);
  const counter = Number(new DataView(frame.buffer, frame.byteOffset + 1, 8).getBigUint64(0));
  assert.ok(signals.length === 0 || counter > signals.at(-1).seq, "counters strictly increase");
  signals.push({ seq: counter, hex: hex(frame), plaintext_hex: hex(pt) });
}

// A link of JS's own making, for Go to parse.
const gen = await Link.generate();
const generated = {
  code: gen.toCode(),
  accessToken: gen.accessToken,
  envelope: hex(await sealEnvelope(gen.envelopeKey("p2c"), 1, "generated")),
};

writeFileSync(outPath, JSON.stringify({ code: link.toCode(), accessToken: link.accessToken, envelopes, signals, generated }));
console.log(`cross.mjs: ${input.envelopes.length} Go envelopes, ${input.signals.flat().length} Go signal frames checked; ${envelopes.length} envelopes, ${signals.length} frames sealed`);
