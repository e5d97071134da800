// The Mailbox against the real relay (e2e/mailbox_node_test.go starts it
// with RELAY_MAX_ENVELOPE=1024 and RELAY_MAX_STORED=16 on a fixed mailbox
// port, and restarts it when this program prints "restart", answering
// "restarted" on stdin). Each part uses its own link, since the relay's rate
// buckets are per mailbox. Any failed assertion throws: a non-zero exit
// fails the Go test with everything printed here.
import assert from "node:assert/strict";
import { createInterface } from "node:readline";
import { Link } from "../../dist/link.js";
import { Mailbox } from "../../dist/mailbox.js";
import { NetworkError, RelayError, SocketClosedError } from "../../dist/errors.js";
import { sealEnvelope, openEnvelope } from "../../dist/envelope.js";
import { fromUtf8 } from "../../dist/bytes.js";

const relay = process.env.RELAY_ORIGIN;
const MAX_ENVELOPE = Number(process.env.RELAY_MAX_ENVELOPE);
const MAX_STORED = Number(process.env.RELAY_MAX_STORED);
if (!relay || !MAX_ENVELOPE || !MAX_STORED) throw new Error("RELAY_ORIGIN, RELAY_MAX_ENVELOPE and RELAY_MAX_STORED must be set");

const log = (s) => console.log(`# ${s}`);
const timing = { backoffMinMs: 100, backoffMaxMs: 1000 };

/** The two devices of a fresh link, claimed: primary writes p2c, companion writes c2p. */
async function pair(opts = {}) {
  const link = await Link.generate();
  const companionLink = await Link.fromCode(link.toCode());
  const mk = (l, role) => new Mailbox({ relay, app: "demo", link: l, role, maxEnvelope: MAX_ENVELOPE, watchTiming: timing, ...opts });
  const P = mk(link, "primary");
  const C = mk(companionLink, "companion");
  assert.equal(await P.claim(), "created", "primary's claim");
  assert.equal(await C.claim(), "owned", "companion's claim");
  return { link, companionLink, P, C, mk };
}

async function until(cond, what, ms = 15_000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function relayError(p, status, code, what) {
  try {
    await p;
  } catch (e) {
    if (!(e instanceof RelayError)) throw new Error(`${what}: want RelayError ${status} ${code}, got ${e?.stack ?? e}`);
    assert.equal(e.status, status, `${what}: status (${e.message})`);
    assert.equal(e.code, code, `${what}: code (${e.message})`);
    return e;
  }
  throw new Error(`${what}: want RelayError ${status} ${code}, it succeeded`);
}

/** A watcher that records what it gets. */
function recorder(m) {
  const got = { messages: [], opens: 0, errors: [] };
  got.w = m.watch({
    onMessage: (x) => got.messages.push([x.seq, fromUtf8(x.plaintext)]),
    onOpen: () => got.opens++,
    onError: (e) => got.errors.push(e),
  });
  return got;
}

const stdin = createInterface({ input: process.stdin });
const lines = stdin[Symbol.asyncIterator]();

// ---- claims, tokens, unknown mailboxes ----
{
  const { link, P } = await pair();
  // A different token on the same id: another key, the same id.
  const intruder = new Mailbox({ relay, app: "demo", link: await Link.fromKey(crypto.getRandomValues(new Uint8Array(32)), link.id), role: "primary" });
  await relayError(intruder.claim(), 409, "taken", "another token's claim");
  await relayError(intruder.get("p2c", 1), 403, "forbidden", "another token's get");
  await relayError(intruder.head("p2c"), 403, "http_403", "another token's HEAD (no body)");
  assert.equal(await P.claim(), "owned", "the owner's claim again");
  await P.heartbeat();
  const never = new Mailbox({ relay, app: "demo", link: await Link.generate(), role: "primary" });
  await relayError(never.get("p2c", 1), 404, "not_found", "a mailbox never claimed");
  await relayError(never.batch("p2c"), 404, "not_found", "a batch of a mailbox never claimed");
  const noApp = new Mailbox({ relay, app: "nosuchapp", link, role: "primary" });
  await relayError(noApp.claim(), 404, "not_found", "an unknown app");
  log("claims: created, owned, 409 taken, 403 forbidden, 404 not_found");
}

// ---- sealed both ways, batch paging, HEAD, has, receive, watch, prune, erase ----
{
  const { link, companionLink, P, C, mk } = await pair();
  // nextSeq unset: the first send asks HEAD (empty: 1).
  assert.deepEqual([await P.send("p2c 1"), await P.send("p2c 2 \u00e9"), await P.send("p2c 3", { notify: "alert" })], [1, 2, 3], "primary's sequences");
  assert.deepEqual([await C.send("c2p 1"), await C.send("c2p 2", { notify: "silent" })], [1, 2], "companion's sequences");
  assert.equal(P.nextSeq, 4);
  assert.deepEqual(await P.head("p2c"), { first: 1, last: 3, count: 3 }, "HEAD p2c");
  assert.deepEqual(await C.head("c2p"), { first: 1, last: 2, count: 2 }, "HEAD c2p");
  assert.equal(await C.has("p2c", 3), true, "has p2c/3");
  assert.equal(await C.has("p2c", 4), false, "has p2c/4");
  // What the relay holds is sealed: it opens only with the link's key.
  const raw = await C.get("p2c", 2);
  assert.equal(raw.length, 25 + "p2c 2 \u00e9".length + 1);
  assert.equal(fromUtf8((await openEnvelope(companionLink.envelopeKey("p2c"), raw)).plaintext), "p2c 2 \u00e9");
  assert.ok(!Buffer.from(raw).includes(Buffer.from("p2c 2")), "plaintext in the stored envelope");
  await relayError(C.get("p2c", 4), 404, "not_found", "get of a sequence not stored");

  // Batch paging: more = 1 until the last page.
  let b = await C.batch("p2c", { after: 0, limit: 2 });
  assert.equal(b.more, true, "page 1 more");
  assert.equal(b.envelopes.length, 2);
  b = await C.batch("p2c", { after: 2, limit: 2 });
  assert.deepEqual([b.more, b.envelopes.length], [false, 1], "page 2");
  assert.deepEqual(b.envelopes[0], await C.get("p2c", 3));
  b = await C.batch("p2c", { after: 3 });
  assert.deepEqual([b.more, b.envelopes.length], [false, 0], "nothing above 3");

  // receive, paging through the relay's pages (limit 2 per request would be a receive of 2).
  assert.deepEqual((await C.receive({ limit: 2 })).map((m) => m.seq), [1, 2], "receive limit 2");
  assert.deepEqual((await C.receive()).map((m) => [m.seq, fromUtf8(m.plaintext)]), [[3, "p2c 3"]], "receive the rest");
  assert.deepEqual((await P.receive()).map((m) => [m.seq, fromUtf8(m.plaintext)]), [[1, "c2p 1"], [2, "c2p 2"]], "primary's receive");
  assert.equal(C.readerFloor, 3);

  // Watch each other with fresh readers: stored first, then live, in order, once.
  const PW = mk(link, "primary");
  const CW = mk(companionLink, "companion");
  const pw = recorder(PW);
  const cw = recorder(CW);
  await until(() => cw.messages.length === 3 && pw.messages.length === 2, "the stored envelopes on both watches");
  assert.deepEqual([await P.send("p2c 4"), await P.send("p2c 5")], [4, 5]);
  assert.equal(await C.send("c2p 3"), 3);
  await until(() => cw.messages.length === 5 && pw.messages.length === 3, "the live envelopes on both watches");
  assert.deepEqual(cw.messages, [[1, "p2c 1"], [2, "p2c 2 \u00e9"], [3, "p2c 3"], [4, "p2c 4"], [5, "p2c 5"]], "companion's watch");
  assert.deepEqual(pw.messages, [[1, "c2p 1"], [2, "c2p 2"], [3, "c2p 3"]], "primary's watch");
  assert.deepEqual([pw.opens, pw.errors, cw.opens, cw.errors, PW.dropped, CW.dropped], [1, [], 1, [], 0, 0], "opens, errors, drops");

  // The same bytes again: 200 same. Other bytes under a stored sequence: 409 conflict.
  const e2 = await C.get("p2c", 2);
  assert.equal(await P.put("p2c", 2, e2), "same", "a retry of p2c/2");
  const otherBytes = new Uint8Array(e2);
  otherBytes[otherBytes.length - 1] ^= 1;
  await relayError(P.put("p2c", 2, otherBytes), 409, "conflict", "other bytes under p2c/2");

  // Prune what the companion has read: nothing old comes back, and the pruned mark refuses old numbers.
  assert.deepEqual((await C.receive()).map((m) => m.seq), [4, 5]);
  await C.prune("p2c", C.readerFloor);
  assert.deepEqual(await P.head("p2c"), { first: 0, last: 0, count: 0 }, "HEAD after the prune");
  assert.deepEqual(await C.receive(), [], "receive after the prune");
  assert.deepEqual(await mk(companionLink, "companion").receive(), [], "a fresh reader after the prune");
  assert.equal(await C.has("p2c", 5), false);
  // (sealed under another link's key: the relay checks only the outside, and this link's key never seals 5 twice)
  const stranger = (await Link.generate()).envelopeKey("p2c");
  await relayError(P.put("p2c", 5, await sealEnvelope(stranger, 5, "x")), 409, "conflict", "a put at the pruned mark");
  await relayError(P.put("p2c", 1, await sealEnvelope(stranger, 1, "x")), 409, "conflict", "a put below the pruned mark");
  // A writer that did not keep nextSeq numbers from HEAD (0 now) and is refused, as documented.
  const forgetful = mk(link, "primary");
  const e = await relayError(forgetful.send("again"), 409, "conflict", "a send numbered from HEAD after a full prune");
  assert.match(e.message, /persist nextSeq/);
  // The writer that kept its counter goes on.
  assert.equal(await P.send("p2c 6"), 6);
  await until(() => cw.messages.length === 6, "p2c 6 on the watch");
  assert.deepEqual(cw.messages[5], [6, "p2c 6"]);

  // Erase: both watches stop with 1000, and the mailbox is gone.
  await P.erase();
  await Promise.all([pw.w.closed, cw.w.closed]);
  for (const [name, r] of [["primary", pw], ["companion", cw]]) {
    assert.ok(r.w.error instanceof SocketClosedError, `${name}'s watch error: ${r.w.error}`);
    assert.equal(r.w.error.code, 1000, `${name}'s watch close code`);
    assert.equal(r.opens, 1, `${name}'s opens`);
  }
  await relayError(P.head("p2c"), 404, "http_404", "HEAD after erase");
  await relayError(C.get("p2c", 6), 404, "not_found", "get after erase");
  await relayError(C.send("late"), 404, "not_found", "send after erase");
  log("mailbox: sealed both ways, batch paging, HEAD, watch stored then live, 200 same, 409 conflict, prune, erase closes with 1000");
}

// ---- limits: 413 at the limit and one past, 507 ----
{
  const { link, P, C, mk } = await pair();
  const key = link.envelopeKey("p2c");
  const atLimit = await sealEnvelope(key, 1, new Uint8Array(MAX_ENVELOPE - 25).fill(1));
  assert.equal(atLimit.length, MAX_ENVELOPE);
  assert.equal(await P.put("p2c", 1, atLimit), "created", `a ${MAX_ENVELOPE}-byte envelope`);
  const past = await sealEnvelope(key, 2, new Uint8Array(MAX_ENVELOPE - 24).fill(2));
  await relayError(P.put("p2c", 2, past), 413, "too_large", `a ${MAX_ENVELOPE + 1}-byte envelope`);
  assert.equal(await P.has("p2c", 2), false, "the refused envelope stored nothing");
  // send() refuses it itself with the relay's limit configured, and spends no number.
  P.nextSeq = 2;
  await assert.rejects(P.send(new Uint8Array(MAX_ENVELOPE - 24)), RangeError);
  assert.equal(P.nextSeq, 2);
  // Configured larger than the relay's: the relay's 413 comes through.
  const loose = new Mailbox({ relay, app: "demo", link, role: "primary", maxEnvelope: MAX_ENVELOPE * 2 });
  loose.nextSeq = 2;
  await relayError(loose.send(new Uint8Array(MAX_ENVELOPE - 24)), 413, "too_large", "send past the relay's limit");
  // Fill the direction to RELAY_MAX_STORED: the next is 507; a prune makes room.
  P.nextSeq = 3;
  for (let i = 2; i <= MAX_STORED; i++) await P.send(`fill ${i}`);
  assert.equal((await P.head("p2c")).count, MAX_STORED);
  const seq = P.nextSeq;
  await relayError(P.send("one too many"), 507, "mailbox_full", "a direction holding RELAY_MAX_STORED");
  assert.equal(await P.has("p2c", seq), false);
  assert.equal(P.nextSeq, seq + 1, "the refused send spent its number");
  assert.deepEqual(P.pending.map((p) => p.seq), [seq], "the refused send's envelope is pending");
  // Sequence 2 was never stored (the 413s above), so the reader's floor
  // stays at 1: prune through the last sequence received instead.
  const got = await C.receive({ limit: 5 });
  await C.prune("p2c", got.at(-1).seq);
  assert.equal(await P.send("after the prune"), seq + 1);
  assert.deepEqual(P.pending, [], "the pending envelope was stored first");
  assert.deepEqual((await C.receive()).map((m) => [m.seq, new TextDecoder().decode(m.plaintext)]).slice(-2),
    [[seq, "one too many"], [seq + 1, "after the prune"]], "both arrive, in order");
  log(`limits: ${MAX_ENVELOPE} bytes stored, ${MAX_ENVELOPE + 1} 413, ${MAX_STORED + 1}th envelope 507`);
}

// ---- rate limit: the fetch bucket (burst 240, 4/s) ----
{
  const { link, P } = await pair();
  const strict = new Mailbox({ relay, app: "demo", link, role: "primary", retryRateLimited: false });
  let ok = 0;
  let limited;
  const began = performance.now();
  for (let round = 0; round < 20 && !limited; round++) {
    const rs = await Promise.allSettled(Array.from({ length: 20 }, () => strict.head("p2c")));
    for (const r of rs) {
      if (r.status === "fulfilled") ok++;
      else if (r.reason instanceof RelayError && r.reason.status === 429) limited ??= r.reason;
      else throw r.reason;
    }
  }
  assert.ok(limited, "no 429 after 400 HEADs");
  assert.equal(limited.code, "http_429", "a HEAD's 429 has no body");
  // The burst, plus what the bucket refilled (4/s) while the HEADs ran: a
  // loaded machine makes the run take seconds.
  const refilled = Math.ceil((4 * (performance.now() - began)) / 1000);
  assert.ok(ok >= 230 && ok <= 260 + refilled, `HEADs answered before the 429: ${ok} (burst 240, ${refilled} refilled)`);
  assert.ok(Number.isInteger(limited.retryAfter) && limited.retryAfter >= 1, `Retry-After ${limited.retryAfter}`);
  // A GET's 429 carries the JSON body. The bucket refills a token every
  // 250 ms, so a slow step may find one: a few tries drain it again.
  let batchLimited;
  for (let i = 0; i < 10 && !batchLimited; i++) {
    try {
      await strict.batch("p2c");
    } catch (e) {
      if (!(e instanceof RelayError && e.status === 429)) throw e;
      batchLimited = e;
    }
  }
  assert.ok(batchLimited, "no 429 for a batch in 10 tries with the bucket drained");
  assert.equal(batchLimited.code, "rate_limited", "a batch's 429 carries the JSON body");
  // The default client waits out a short Retry-After once and gets through.
  assert.deepEqual(await P.head("p2c"), { first: 0, last: 0, count: 0 }, "HEAD with the retry");
  log(`rate limit: ${ok} HEADs, then 429 with Retry-After ${limited.retryAfter}`);
}

// ---- watch resumes after the relay restarts ----
{
  const { link, companionLink, P, mk } = await pair();
  const CW = mk(companionLink, "companion");
  const cw = recorder(CW);
  for (let i = 1; i <= 3; i++) await P.send(`before ${i}`);
  await until(() => cw.messages.length === 3, "3 envelopes before the restart");
  console.log("restart");
  const answer = await lines.next();
  assert.equal(answer.value, "restarted", "the Go side's answer");
  // The first request may meet a connection the old process closed.
  for (let i = 0; ; i++) {
    try {
      await P.head("p2c");
      break;
    } catch (e) {
      if (i >= 2 || !(e instanceof NetworkError)) throw e;
    }
  }
  // One right away (the watch may not be back yet: it comes as stored), one once it is open.
  assert.equal(await P.send("after 4"), 4);
  await until(() => cw.opens === 2, "the watch to reopen", 30_000).catch((e) => {
    throw new Error(`${e.message}; watch errors: ${cw.errors.map((x) => `${x.name} ${x.message}`).join("; ")}; stopped: ${cw.w.error}`);
  });
  assert.equal(await P.send("after 5"), 5);
  await until(() => cw.messages.length === 5, "5 envelopes");
  await new Promise((r) => setTimeout(r, 200)); // a duplicate would come right behind
  assert.deepEqual(cw.messages, [[1, "before 1"], [2, "before 2"], [3, "before 3"], [4, "after 4"], [5, "after 5"]], "nothing lost or doubled");
  assert.equal(CW.dropped, 0, "the reopened watch resumed above 3 (no replays)");
  assert.ok(cw.errors.length >= 1 && cw.errors.every((e) => e instanceof SocketClosedError), `errors: ${cw.errors}`);
  assert.equal(cw.errors[0].code, 1001, `the draining relay's close code (${cw.errors[0].message})`);
  // Then only refused connections while it was down (no open timeouts).
  assert.deepEqual(cw.errors.slice(1).filter((e) => e.code !== 1006).map((e) => e.message), [], "closes after the 1001");
  log(`watch: resumed after a restart (closes seen: ${cw.errors.map((e) => e.code).join(",")})`);
  cw.w.close();
  await cw.w.closed;
  void link;
}

stdin.close();
console.log("ok");
