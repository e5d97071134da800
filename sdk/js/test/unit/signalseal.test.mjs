// Signal frames against the Go SDK's SignalSender/SignalReceiver rules (the
// cases of sdk/link/signal_test.go): the counter under a frozen or stepped
// clock, skew edges, replays, the tag checked first.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SignalSealer, SignalOpener, SIGNAL_MAX_SKEW_MS } from "../../dist/signalseal.js";
import { envelopeSequence, sealEnvelope, SealError } from "../../dist/envelope.js";
import { Link } from "../../dist/link.js";
import { fromUtf8 } from "../../dist/bytes.js";

const BASE = 1_700_000_000_000;
const link = await Link.generate();
const KEY = link.signalKey("p2c");

/** A settable clock: c.now is the function to inject, c.t the time in ms. */
function clock(t) {
  const c = { t, now: () => c.t };
  return c;
}

async function code(p) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof SealError, `not a SealError: ${e}`);
    return e.code;
  }
  return "ok";
}

test("constants", () => {
  assert.equal(SIGNAL_MAX_SKEW_MS, 5 * 60 * 1000);
});

test("counter: the clock, strictly increasing under a frozen or stepped-back clock", async () => {
  const c = clock(BASE);
  const s = new SignalSealer(KEY, c.now);
  const r = new SignalOpener(KEY, clock(BASE).now); // the receiver's clock stays put
  assert.equal(s.last, 0);
  let last = 0;
  async function step(what, want) {
    const f = await s.seal(what);
    const got = envelopeSequence(f);
    assert.equal(got, want, what);
    assert.ok(got > last, what);
    assert.equal(s.last, got);
    last = got;
    assert.equal(fromUtf8(await r.open(f)), what);
    assert.equal(r.last, got);
  }
  await step("first: the clock", BASE);
  await step("frozen clock", BASE + 1);
  await step("still frozen", BASE + 2);
  c.t = BASE - 1000;
  await step("clock stepped back", BASE + 3);
  c.t = BASE + 10;
  await step("clock ahead again", BASE + 10);
  c.t = -5;
  await step("clock before 1970: counting still goes on", BASE + 11);
  c.t = BASE + 20.7;
  await step("fractional ms are truncated", BASE + 20);
});

test("counter: 1000 frames in one frozen millisecond are 1000 distinct counters", async () => {
  const s = new SignalSealer(KEY, () => BASE);
  const frames = await Promise.all(Array.from({ length: 1000 }, () => s.seal("x")));
  const counters = frames.map(envelopeSequence);
  assert.equal(new Set(counters).size, 1000);
  assert.equal(Math.min(...counters), BASE);
  assert.equal(Math.max(...counters), BASE + 999);
  assert.equal(s.last, BASE + 999);
});

test("counter: never 0, even at the epoch", async () => {
  const s = new SignalSealer(KEY, () => 0);
  assert.equal(envelopeSequence(await s.seal(new Uint8Array(0))), 1);
  assert.equal(envelopeSequence(await s.seal(new Uint8Array(0))), 2);
});

test("default clock: Date.now", async () => {
  const s = new SignalSealer(KEY);
  const before = Date.now();
  const n = envelopeSequence(await s.seal("x"));
  assert.ok(n >= before && n <= Date.now(), `${n} not within [${before}, now]`);
  const r = new SignalOpener(KEY);
  assert.equal(fromUtf8(await r.open(await s.seal("y"))), "y");
});

test("skew: exactly 5 min either way is accepted, 5 min + 1 ms is stale (as Go's withinSkew, inclusive)", async () => {
  const min5 = 5 * 60 * 1000;
  for (const [name, skew, want] of [
    ["same clock", 0, "ok"],
    ["5 min ahead", min5, "ok"],
    ["5 min behind", -min5, "ok"],
    ["5 min 1 ms ahead", min5 + 1, "stale"],
    ["5 min 1 ms behind", -min5 - 1, "stale"],
    ["a year behind", -365 * 24 * 3600 * 1000, "stale"],
  ]) {
    const s = new SignalSealer(KEY, () => BASE + skew);
    const r = new SignalOpener(KEY, () => BASE);
    assert.equal(await code(r.open(await s.seal("x"))), want, name);
    if (want !== "ok") assert.equal(r.last, 0, `${name}: a stale frame moved last`);
  }
});

test("skew: a receiver clock before 1970 counts as 1970", async () => {
  const r = new SignalOpener(KEY, () => -1_000_000);
  assert.equal(await code(r.open(await sealEnvelope(KEY, SIGNAL_MAX_SKEW_MS, "edge"))), "ok");
  assert.equal(await code(r.open(await sealEnvelope(KEY, SIGNAL_MAX_SKEW_MS + 1, "past"))), "stale");
});

test("a stale frame changes nothing: an honest frame below its counter still opens", async () => {
  const r = new SignalOpener(KEY, () => BASE);
  const future = await new SignalSealer(KEY, () => BASE + SIGNAL_MAX_SKEW_MS + 1).seal("future");
  assert.equal(await code(r.open(future)), "stale");
  assert.equal(r.last, 0);
  assert.equal(await code(r.open(await new SignalSealer(KEY, () => BASE).seal("now"))), "ok");
  assert.equal(r.last, BASE);
});

test("replay: at or below the last accepted; the tag is checked first; other keys fail", async () => {
  const c = clock(BASE);
  const s = new SignalSealer(KEY, c.now);
  const r = new SignalOpener(KEY, c.now);
  const f1 = await s.seal("1");
  const f2 = await s.seal("2");
  const f3 = await s.seal("3");
  assert.equal(await code(r.open(f2)), "ok");
  assert.equal(await code(r.open(f2)), "replay");
  assert.equal(await code(r.open(f1)), "replay"); // frames are not reordered on a socket
  const bad = new Uint8Array(f3);
  bad[bad.length - 1] ^= 1;
  assert.equal(await code(r.open(bad)), "bad_tag");
  // A forged frame that is also a replay and stale is reported as bad_tag:
  // nothing about an unauthenticated frame's counter is believed.
  const forged = await sealEnvelope(link.signalKey("c2p"), 5, "x");
  assert.equal(await code(r.open(forged)), "bad_tag");
  assert.equal(r.last, BASE + 1);
  assert.equal(fromUtf8(await r.open(f3)), "3");
  assert.equal(r.last, BASE + 2);
  // Under the other direction's key nothing opens.
  const other = new SignalSealer(link.signalKey("c2p"), c.now);
  c.t += 1000;
  assert.equal(await code(r.open(await other.seal("x"))), "bad_tag");
  // Nor under the envelope key of the same direction.
  assert.equal(await code(r.open(await new SignalSealer(link.envelopeKey("p2c"), c.now).seal("x"))), "bad_tag");
});

test("malformed frames", async () => {
  const r = new SignalOpener(KEY, () => BASE);
  const f = await new SignalSealer(KEY, () => BASE).seal(new Uint8Array(0));
  assert.equal(f.length, 25);
  assert.equal(await code(r.open(f.subarray(0, 24))), "malformed");
  const v = new Uint8Array(f);
  v[0] = 2;
  assert.equal(await code(r.open(v)), "malformed");
  const z = new Uint8Array(f);
  z.fill(0, 1, 9);
  assert.equal(await code(r.open(z)), "malformed");
  assert.equal(r.last, 0);
  assert.equal(await code(r.open(f)), "ok");
});

test("concurrent opens of one frame accept it once", async () => {
  const r = new SignalOpener(KEY, () => BASE);
  const f = await new SignalSealer(KEY, () => BASE).seal("once");
  const results = await Promise.all([1, 2, 3].map(() => code(r.open(f))));
  assert.deepEqual(results.sort(), ["ok", "replay", "replay"]);
});

test("plaintext must be bytes or a string", async () => {
  await assert.rejects(new SignalSealer(KEY, () => BASE).seal(42), TypeError);
});
