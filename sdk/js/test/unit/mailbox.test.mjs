// Mailbox against a fake fetch and a fake WebSocket: the exact requests
// (method, URL, headers with the bearer and X-Relay-Notify, bodies), every
// answer of spec/mailbox.md's Answers table as a RelayError, the sealed
// send/receive, and the Watcher's reconnects, pings and stops.
import { test, afterEach } from "node:test";
import assert from "node:assert/strict";
import { Mailbox, MAX_PENDING, WATCH_SUBPROTOCOL, BEARER_SUBPROTOCOL } from "../../dist/mailbox.js";
import { RelayError, SocketClosedError, ProtocolError, NetworkError } from "../../dist/errors.js";
import { encodeBatch } from "../../dist/batch.js";
import { Link } from "../../dist/link.js";
import { sealEnvelope, openEnvelope, SealError } from "../../dist/envelope.js";
import { fromUtf8 } from "../../dist/bytes.js";

const RELAY = "http://relay.test";
const link = await Link.fromKey(new Uint8Array(32).fill(1), "AAAAAAAAAAAAAAAAAAAAAA");
const other = await Link.fromKey(new Uint8Array(32).fill(2), "AAAAAAAAAAAAAAAAAAAAAA");
const BASE = `${RELAY}/v1/demo/mailbox/${link.id}`;
const AUTH = `Bearer ${link.accessToken}`;

/**
 * A fetch that records each request and answers with the next of answers
 * (a function of the request, or a Response); records: {method, url, headers
 * (lowercase names), body (Uint8Array or null)}.
 */
function fakeFetch(...answers) {
  const requests = [];
  const f = async (url, init = {}) => {
    const headers = {};
    for (const [k, v] of Object.entries(init.headers ?? {})) headers[k.toLowerCase()] = v;
    const req = { method: init.method ?? "GET", url: String(url), headers, body: init.body ? new Uint8Array(init.body) : null, init };
    requests.push(req);
    const a = answers.shift();
    if (a === undefined) throw new Error(`fake fetch: unexpected request ${req.method} ${req.url}`);
    return typeof a === "function" ? a(req) : a;
  };
  f.requests = requests;
  return f;
}

/** A relay answer: status, JSON error body (unless body is given) and headers. */
function answer(status, { code, headers = {}, body } = {}) {
  if (body === undefined && code !== undefined) {
    body = JSON.stringify({ error: code, status });
    headers = { "Content-Type": "application/json", "Cache-Control": "no-store", ...headers };
  }
  return new Response([101, 204, 205, 304].includes(status) ? null : (body ?? null), { status, headers });
}

const batchAnswer = (envs, more) =>
  answer(200, { body: encodeBatch(envs), headers: { "Content-Type": "application/vnd.zerobyte.batch", "X-Relay-More": more ? "1" : "0" } });

const headAnswer = (first, last, count) =>
  answer(200, { headers: { "X-Relay-First": String(first), "X-Relay-Last": String(last), "X-Relay-Count": String(count) } });

function mailbox(fetch, extra = {}) {
  return new Mailbox({ relay: RELAY, app: "demo", link, role: "primary", fetch, ...extra });
}

async function rejects(p, check) {
  let err;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  assert.ok(err, "expected a rejection");
  check(err);
  return err;
}

test("constructor: directions, id; bad relay, app, role", () => {
  const m = mailbox(fakeFetch());
  assert.equal(m.id, link.id);
  assert.equal(m.writes, "p2c");
  assert.equal(m.reads, "c2p");
  const c = new Mailbox({ relay: RELAY, app: "demo", link, role: "companion" });
  assert.deepEqual([c.writes, c.reads], ["c2p", "p2c"]);
  assert.throws(() => new Mailbox({ relay: "ftp://x", app: "demo", link, role: "primary" }), TypeError);
  assert.throws(() => new Mailbox({ relay: "not a url", app: "demo", link, role: "primary" }), TypeError);
  assert.throws(() => new Mailbox({ relay: RELAY, app: "Demo", link, role: "primary" }), TypeError);
  assert.throws(() => new Mailbox({ relay: RELAY, app: "a".repeat(33), link, role: "primary" }), TypeError);
  assert.throws(() => new Mailbox({ relay: RELAY, app: "demo", link, role: "server" }), TypeError);
});

test("claim: PUT with the bearer and no body; 201 created, 204 owned, 409 taken", async () => {
  const f = fakeFetch(answer(201), answer(204), answer(409, { code: "taken" }));
  const m = mailbox(f);
  assert.equal(await m.claim(), "created");
  assert.equal(await m.claim(), "owned");
  await rejects(m.claim(), (e) => {
    assert.ok(e instanceof RelayError);
    assert.equal(e.status, 409);
    assert.equal(e.code, "taken");
    assert.equal(e.retryAfter, undefined);
    assert.match(e.message, /claim: relay answered 409 taken/);
  });
  for (const r of f.requests) {
    assert.equal(r.method, "PUT");
    assert.equal(r.url, BASE);
    assert.equal(r.headers.authorization, AUTH);
    assert.equal(r.body, null);
    assert.equal(r.init.redirect, "error");
  }
});

test("a relay URL with a path prefix and a trailing slash keeps the prefix", async () => {
  const f = fakeFetch(answer(204));
  await new Mailbox({ relay: "https://h.test/edge/", app: "demo", link, role: "primary", fetch: f }).heartbeat();
  assert.equal(f.requests[0].url, `https://h.test/edge/v1/demo/mailbox/${link.id}`);
  assert.equal(f.requests[0].method, "PUT");
});

test("erase: DELETE the mailbox, 204", async () => {
  const f = fakeFetch(answer(204), answer(404, { code: "not_found" }));
  const m = mailbox(f);
  await m.erase();
  await rejects(m.erase(), (e) => assert.equal(e.code, "not_found"));
  assert.deepEqual(f.requests.map((r) => [r.method, r.url, r.headers.authorization]), [
    ["DELETE", BASE, AUTH],
    ["DELETE", BASE, AUTH],
  ]);
});

test("every answer of the Answers table is a RelayError with status, code and Retry-After", async () => {
  const rows = [
    [400, "bad_request"], [401, "unauthorized"], [403, "forbidden"], [404, "not_found"],
    [409, "taken"], [409, "conflict"], [413, "too_large"], [429, "rate_limited", "7"],
    [429, "too_many_watchers"], [502, "upstream_unavailable"], [507, "mailbox_full"],
    [503, "storage_unavailable", "2"],
  ];
  for (const [status, code, retry] of rows) {
    const f = fakeFetch(answer(status, { code, headers: retry ? { "Retry-After": retry } : {} }));
    const m = mailbox(f, { retryRateLimited: false });
    await rejects(m.put("p2c", 3, new Uint8Array(25)), (e) => {
      assert.ok(e instanceof RelayError, `${status} ${code}: ${e}`);
      assert.equal(e.name, "RelayError");
      assert.equal(e.status, status);
      assert.equal(e.code, code);
      assert.equal(e.retryAfter, retry ? Number(retry) : undefined);
      assert.match(e.message, new RegExp(`put p2c/3: relay answered ${status} ${code}`));
    });
  }
});

test("an answer without the JSON body: code http_<status>", async () => {
  const cases = [
    answer(502, { body: "<html>Bad Gateway</html>", headers: { "Content-Type": "text/html" } }),
    answer(500, { body: "" }),
    answer(418, { body: JSON.stringify({ error: "Has Spaces", status: 418 }) }),
    answer(400, { body: JSON.stringify({ error: "bad_request" }) }), // no status field
    answer(400, { body: JSON.stringify(["bad_request", 400]) }),
    answer(400, { body: "x".repeat(5000) }),
  ];
  const want = ["http_502", "http_500", "http_418", "http_400", "http_400", "http_400"];
  for (const [i, a] of cases.entries()) {
    await rejects(mailbox(fakeFetch(a)).get("c2p", 1), (e) => {
      assert.ok(e instanceof RelayError);
      assert.equal(e.code, want[i], `case ${i}`);
    });
  }
  // HEAD answers have no body.
  await rejects(mailbox(fakeFetch(answer(404))).head("c2p"), (e) => {
    assert.equal(e.status, 404);
    assert.equal(e.code, "http_404");
  });
});

test("put: octet-stream body as given, X-Relay-Notify when asked; 201 created, 200 same", async () => {
  const f = fakeFetch(answer(201), answer(200), answer(201), answer(201));
  const m = mailbox(f);
  const env = new Uint8Array(30).map((_, i) => i);
  assert.equal(await m.put("p2c", 7, env), "created");
  assert.equal(await m.put("p2c", 7, env), "same");
  assert.equal(await m.put("c2p", 2 ** 53 - 1, env, "alert"), "created");
  assert.equal(await m.put("p2c", 8, env, "silent"), "created");
  const [a, b, c, d] = f.requests;
  assert.equal(a.method, "PUT");
  assert.equal(a.url, `${BASE}/p2c/7`);
  assert.equal(a.headers.authorization, AUTH);
  assert.equal(a.headers["content-type"], "application/octet-stream");
  assert.equal(a.headers["x-relay-notify"], undefined);
  assert.deepEqual(a.body, env);
  assert.deepEqual(b.body, env);
  assert.equal(c.url, `${BASE}/c2p/9007199254740991`);
  assert.equal(c.headers["x-relay-notify"], "alert");
  assert.equal(d.headers["x-relay-notify"], "silent");
});

test("put: bad direction, sequence or notify are refused before any request", async () => {
  const f = fakeFetch();
  const m = mailbox(f);
  const env = new Uint8Array(25);
  await rejects(m.put("x2y", 1, env), (e) => assert.ok(e instanceof TypeError));
  for (const seq of [0, -1, 1.5, 2 ** 53, NaN]) await rejects(m.put("p2c", seq, env), (e) => assert.ok(e instanceof RangeError, String(seq)));
  await rejects(m.put("p2c", 1, env, "loud"), (e) => assert.ok(e instanceof TypeError));
  await rejects(m.put("p2c", 1, "not bytes"), (e) => assert.ok(e instanceof TypeError));
  assert.equal(f.requests.length, 0);
});

test("get: the envelope's bytes; 404 not_found", async () => {
  const env = new Uint8Array(40).fill(9);
  const f = fakeFetch(answer(200, { body: env, headers: { "Content-Type": "application/octet-stream" } }), answer(404, { code: "not_found" }));
  const m = mailbox(f);
  assert.deepEqual(await m.get("c2p", 12), env);
  await rejects(m.get("c2p", 13), (e) => assert.deepEqual([e.status, e.code], [404, "not_found"]));
  assert.deepEqual(f.requests.map((r) => [r.method, r.url, r.headers.authorization]), [
    ["GET", `${BASE}/c2p/12`, AUTH],
    ["GET", `${BASE}/c2p/13`, AUTH],
  ]);
  assert.equal(f.requests[0].init.cache, "no-store");
});

test("batch: query, more, decoded envelopes; strict about the answer", async () => {
  const e1 = new Uint8Array(25).fill(1), e2 = new Uint8Array(26).fill(2);
  const f = fakeFetch(batchAnswer([e1, e2], true), batchAnswer([], false));
  const m = mailbox(f);
  assert.deepEqual(await m.batch("c2p", { after: 4, limit: 2 }), { envelopes: [e1, e2], more: true });
  assert.deepEqual(await m.batch("p2c"), { envelopes: [], more: false });
  assert.equal(f.requests[0].url, `${BASE}/c2p?after=4&limit=2`);
  assert.equal(f.requests[0].method, "GET");
  assert.equal(f.requests[0].headers.authorization, AUTH);
  assert.equal(f.requests[1].url, `${BASE}/p2c?after=0`);

  const bad = [
    [answer(200, { body: encodeBatch([e1]), headers: { "Content-Type": "application/octet-stream", "X-Relay-More": "0" } }), "bad_content_type"],
    [answer(200, { body: encodeBatch([e1]), headers: { "Content-Type": "application/vnd.zerobyte.batch" } }), "bad_header"],
    [answer(200, { body: encodeBatch([e1]), headers: { "Content-Type": "application/vnd.zerobyte.batch", "X-Relay-More": "yes" } }), "bad_header"],
    [answer(200, { body: encodeBatch([e1]).subarray(0, 20), headers: { "Content-Type": "application/vnd.zerobyte.batch", "X-Relay-More": "0" } }), "malformed_batch"],
  ];
  for (const [a, code] of bad) {
    await rejects(mailbox(fakeFetch(a)).batch("c2p"), (e) => {
      assert.ok(e instanceof ProtocolError, String(e));
      assert.equal(e.code, code);
    });
  }
  // Limits: 1 and 1000 go out, 0 and 1001 do not.
  const g = fakeFetch(batchAnswer([], false), batchAnswer([], false));
  const n = mailbox(g);
  await n.batch("c2p", { limit: 1 });
  await n.batch("c2p", { limit: 1000, after: 0 });
  assert.deepEqual(g.requests.map((r) => r.url), [`${BASE}/c2p?after=0&limit=1`, `${BASE}/c2p?after=0&limit=1000`]);
  for (const limit of [0, 1001, 2.5]) await rejects(n.batch("c2p", { limit }), (e) => assert.ok(e instanceof RangeError));
  for (const after of [-1, 2 ** 53, 0.5]) await rejects(n.batch("c2p", { after }), (e) => assert.ok(e instanceof RangeError));
  assert.equal(g.requests.length, 2);
});

test("head: first, last, count; a missing or bad header is a ProtocolError", async () => {
  const f = fakeFetch(headAnswer(3, 9, 7), headAnswer(0, 0, 0));
  const m = mailbox(f);
  assert.deepEqual(await m.head("p2c"), { first: 3, last: 9, count: 7 });
  assert.deepEqual(await m.head("c2p"), { first: 0, last: 0, count: 0 });
  assert.deepEqual(f.requests.map((r) => [r.method, r.url, r.headers.authorization]), [
    ["HEAD", `${BASE}/p2c`, AUTH],
    ["HEAD", `${BASE}/c2p`, AUTH],
  ]);
  for (const h of [{ "X-Relay-First": "1", "X-Relay-Last": "2" }, { "X-Relay-First": "1", "X-Relay-Last": "-2", "X-Relay-Count": "1" },
    { "X-Relay-First": "1", "X-Relay-Last": "18446744073709551615", "X-Relay-Count": "1" }]) {
    await rejects(mailbox(fakeFetch(answer(200, { headers: h }))).head("p2c"), (e) => {
      assert.ok(e instanceof ProtocolError);
      assert.equal(e.code, "bad_header");
    });
  }
});

test("has: 200 true, 404 false, anything else a RelayError", async () => {
  const f = fakeFetch(answer(200), answer(404), answer(403));
  const m = mailbox(f);
  assert.equal(await m.has("c2p", 5), true);
  assert.equal(await m.has("c2p", 6), false);
  await rejects(m.has("c2p", 7), (e) => assert.deepEqual([e.status, e.code], [403, "http_403"]));
  assert.deepEqual(f.requests.map((r) => [r.method, r.url]), [["HEAD", `${BASE}/c2p/5`], ["HEAD", `${BASE}/c2p/6`], ["HEAD", `${BASE}/c2p/7`]]);
});

test("prune: DELETE ?through=, 204; through 0 allowed", async () => {
  const f = fakeFetch(answer(204), answer(204));
  const m = mailbox(f);
  await m.prune("c2p", 41);
  await m.prune("p2c", 0);
  assert.deepEqual(f.requests.map((r) => [r.method, r.url, r.headers.authorization]), [
    ["DELETE", `${BASE}/c2p?through=41`, AUTH],
    ["DELETE", `${BASE}/p2c?through=0`, AUTH],
  ]);
  await rejects(m.prune("p2c", -1), (e) => assert.ok(e instanceof RangeError));
});

test("registerPush / unregisterPush: the direction read, JSON body", async () => {
  const f = fakeFetch(answer(204), answer(204), answer(400, { code: "bad_request" }));
  const m = mailbox(f); // primary: reads c2p
  await m.registerPush({ service: "apns", token: "ab".repeat(32), environment: "development", tag: "t1", alert: "Hi" });
  await m.unregisterPush();
  await rejects(m.registerPush({ service: "fcm", token: "x", tag: "t" }), (e) => assert.equal(e.code, "bad_request"));
  const [a, b, c] = f.requests;
  assert.equal(a.method, "PUT");
  assert.equal(a.url, `${BASE}/c2p/push`);
  assert.equal(a.headers["content-type"], "application/json");
  assert.equal(a.headers.authorization, AUTH);
  assert.deepEqual(JSON.parse(fromUtf8(a.body)), { service: "apns", token: "ab".repeat(32), tag: "t1", environment: "development", alert: "Hi" });
  assert.deepEqual([b.method, b.url, b.body], ["DELETE", `${BASE}/c2p/push`, null]);
  assert.deepEqual(JSON.parse(fromUtf8(c.body)), { service: "fcm", token: "x", tag: "t" });
});

test("retryRateLimited: one retry after a Retry-After up to 5 s; not for longer waits, a second 429 or too_many_watchers", async () => {
  const limited = (s) => answer(429, { code: "rate_limited", headers: { "Retry-After": String(s) } });
  let f = fakeFetch(limited(1), answer(201));
  const t0 = Date.now();
  assert.equal(await mailbox(f).put("p2c", 1, new Uint8Array(25)), "created");
  assert.ok(Date.now() - t0 >= 950, `waited ${Date.now() - t0} ms`);
  assert.equal(f.requests.length, 2);
  assert.deepEqual(f.requests[1].body, new Uint8Array(25), "the same bytes again");

  f = fakeFetch(limited(6));
  await rejects(mailbox(f).head("p2c"), (e) => assert.deepEqual([e.status, e.code, e.retryAfter], [429, "rate_limited", 6]));
  assert.equal(f.requests.length, 1);

  f = fakeFetch(limited(1), limited(1));
  await rejects(mailbox(f).head("p2c"), (e) => assert.deepEqual([e.code, e.retryAfter], ["rate_limited", 1]));
  assert.equal(f.requests.length, 2);

  f = fakeFetch(answer(429, { code: "too_many_watchers", headers: { "Retry-After": "1" } }));
  await rejects(mailbox(f).head("p2c"), (e) => assert.equal(e.code, "too_many_watchers"));
  assert.equal(f.requests.length, 1);

  f = fakeFetch(limited(1));
  await rejects(mailbox(f, { retryRateLimited: false }).head("p2c"), (e) => assert.equal(e.retryAfter, 1));
  assert.equal(f.requests.length, 1);
});

test("no answer: NetworkError with fetch's error as cause", async () => {
  const boom = new TypeError("fetch failed");
  const f = fakeFetch(() => { throw boom; });
  await rejects(mailbox(f).claim(), (e) => {
    assert.ok(e instanceof NetworkError);
    assert.equal(e.cause, boom);
    assert.match(e.message, /claim: no answer from http:\/\/relay.test: fetch failed/);
  });
});

test("send: numbers from HEAD's last + 1 when nextSeq is unset, seals with the link's key, then counts on", async () => {
  const f = fakeFetch(headAnswer(2, 4, 3), answer(201), answer(201, {}));
  const m = mailbox(f);
  assert.equal(m.nextSeq, 0);
  assert.equal(await m.send("hello", { notify: "alert" }), 5);
  assert.equal(m.nextSeq, 6);
  assert.equal(await m.send(new Uint8Array([1, 2, 3])), 6);
  assert.equal(m.nextSeq, 7);
  const [h, p1, p2] = f.requests;
  assert.deepEqual([h.method, h.url], ["HEAD", `${BASE}/p2c`]);
  assert.deepEqual([p1.method, p1.url, p1.headers["x-relay-notify"]], ["PUT", `${BASE}/p2c/5`, "alert"]);
  assert.equal(p2.url, `${BASE}/p2c/6`);
  assert.equal(p2.headers["x-relay-notify"], undefined);
  const o1 = await openEnvelope(link.envelopeKey("p2c"), p1.body);
  assert.deepEqual([o1.seq, fromUtf8(o1.plaintext)], [5, "hello"]);
  assert.deepEqual(p1.body, await sealEnvelope(link.envelopeKey("p2c"), 5, "hello"));
  const o2 = await openEnvelope(link.envelopeKey("p2c"), p2.body);
  assert.deepEqual([o2.seq, [...o2.plaintext]], [6, [1, 2, 3]]);
});

test("send: a set nextSeq asks no HEAD; concurrent sends get consecutive numbers in call order", async () => {
  const f = fakeFetch(answer(201), answer(201), answer(201));
  const m = mailbox(f);
  m.nextSeq = 10;
  const seqs = await Promise.all([m.send("a"), m.send("b"), m.send("c")]);
  assert.deepEqual(seqs, [10, 11, 12]);
  assert.deepEqual(f.requests.map((r) => r.url), [`${BASE}/p2c/10`, `${BASE}/p2c/11`, `${BASE}/p2c/12`]);
  for (const [i, r] of f.requests.entries()) {
    assert.equal(fromUtf8((await openEnvelope(link.envelopeKey("p2c"), r.body)).plaintext), "abc"[i]);
  }
  assert.throws(() => (m.nextSeq = -1), RangeError);
  assert.throws(() => (m.nextSeq = 2 ** 53), RangeError);
});

test("send: a failed PUT spends its sequence and leaves the envelope pending; the next send stores those bytes first", async () => {
  const f = fakeFetch(answer(507, { code: "mailbox_full" }), answer(201), answer(201));
  const m = mailbox(f);
  m.nextSeq = 3;
  await rejects(m.send("x", { notify: "alert" }), (e) => assert.deepEqual([e.status, e.code], [507, "mailbox_full"]));
  assert.equal(m.nextSeq, 4);
  const [p] = m.pending;
  assert.equal(m.pending.length, 1);
  assert.equal(p.seq, 3);
  assert.deepEqual(p.envelope, f.requests[0].body);
  assert.equal(await m.send("y"), 4);
  // seq 3 again, the same bytes and the same notify, then 4.
  assert.deepEqual(f.requests.map((r) => r.url), [`${BASE}/p2c/3`, `${BASE}/p2c/3`, `${BASE}/p2c/4`]);
  assert.deepEqual(f.requests[1].body, f.requests[0].body);
  assert.equal(f.requests[1].headers["x-relay-notify"], "alert");
  assert.equal(fromUtf8((await openEnvelope(link.envelopeKey("p2c"), f.requests[1].body)).plaintext), "x");
  assert.deepEqual(m.pending, []);
});

test("send: while an earlier envelope still fails, each new message queues behind it in order; flush stores them; at MAX_PENDING send refuses to seal", async () => {
  const full = () => answer(507, { code: "mailbox_full" });
  const f = fakeFetch(full(), full(), full(), answer(201), answer(200), answer(201));
  const m = mailbox(f);
  m.nextSeq = 1;
  await rejects(m.send("a"), (e) => assert.equal(e.code, "mailbox_full"));
  await rejects(m.send("b"), (e) => assert.equal(e.code, "mailbox_full")); // 1 again, refused: b sealed as 2 and queued
  assert.deepEqual(m.pending.map((p) => p.seq), [1, 2]);
  await rejects(m.flush(), (e) => assert.equal(e.code, "mailbox_full"));
  assert.equal(await m.flush(), 2); // 1 created, 2 "same" (it had landed)
  assert.deepEqual(f.requests.map((r) => r.url.slice(BASE.length)), ["/p2c/1", "/p2c/1", "/p2c/1", "/p2c/1", "/p2c/2"]);
  assert.equal(await m.flush(), 0);
  assert.equal(await m.send("c"), 3);
  // The bound: MAX_PENDING envelopes pending, the next message is not sealed.
  const g = fakeFetch(...Array.from({ length: MAX_PENDING * (MAX_PENDING + 1) }, full));
  const n = mailbox(g);
  n.nextSeq = 1;
  for (let i = 0; i < MAX_PENDING; i++) await rejects(n.send(`m${i}`), (e) => assert.equal(e.code, "mailbox_full"));
  assert.equal(n.pending.length, MAX_PENDING);
  const before = g.requests.length;
  await rejects(n.send("one too many"), (e) => assert.ok(e instanceof RangeError));
  assert.equal(g.requests.length, before);
  assert.equal(n.nextSeq, MAX_PENDING + 1);
});

test("send: an envelope refused for good (409 conflict, 413, 404) leaves the queue; pending is settable only with envelopes that carry their sequence, ascending", async () => {
  const f = fakeFetch(answer(503, { code: "storage_unavailable" }), answer(409, { code: "conflict" }), answer(201));
  const m = mailbox(f);
  m.nextSeq = 5;
  await rejects(m.send("x"), (e) => assert.equal(e.status, 503));
  assert.equal(await m.send("y"), 6); // 5 is taken by other bytes: dropped, 6 stored
  assert.deepEqual(m.pending, []);
  // A refusal for good leaves nothing pending either: 413 and 404.
  const g = fakeFetch(answer(413, { code: "too_large" }), answer(404, { code: "not_found" }));
  const n = mailbox(g);
  n.nextSeq = 1;
  await rejects(n.send("big"), (e) => assert.equal(e.status, 413));
  assert.deepEqual(n.pending, []);
  await rejects(n.send("gone"), (e) => assert.equal(e.status, 404));
  assert.deepEqual(n.pending, []);
  assert.equal(g.requests.length, 2);
  const e7 = await sealEnvelope(link.envelopeKey("p2c"), 7, "z");
  const e8 = await sealEnvelope(link.envelopeKey("p2c"), 8, "z");
  m.pending = [{ seq: 7, envelope: e7 }, { seq: 8, envelope: e8 }];
  assert.deepEqual(m.pending.map((p) => p.seq), [7, 8]);
  assert.throws(() => (m.pending = [{ seq: 8, envelope: e7 }]), TypeError);
  assert.throws(() => (m.pending = [{ seq: 8, envelope: e8 }, { seq: 7, envelope: e7 }]), TypeError);
  assert.throws(() => (m.pending = [{ seq: 7, envelope: e7, notify: "loud" }]), TypeError);
});

test("send: 409 conflict when numbered from HEAD says to persist nextSeq", async () => {
  const f = fakeFetch(headAnswer(0, 0, 0), answer(409, { code: "conflict" }));
  const m = mailbox(f);
  await rejects(m.send("x"), (e) => {
    assert.ok(e instanceof RelayError);
    assert.deepEqual([e.status, e.code], [409, "conflict"]);
    assert.match(e.message, /persist nextSeq/);
  });
  assert.equal(f.requests[1].url, `${BASE}/p2c/1`);
  assert.equal(m.nextSeq, 2);
});

test("send: maxEnvelope at the limit goes out, one past is a RangeError with no sequence spent", async () => {
  const f = fakeFetch(answer(201));
  const m = mailbox(f, { maxEnvelope: 100 });
  m.nextSeq = 1;
  await rejects(m.send(new Uint8Array(76)), (e) => assert.ok(e instanceof RangeError));
  assert.equal(m.nextSeq, 1);
  assert.equal(f.requests.length, 0);
  assert.equal(await m.send(new Uint8Array(75)), 1);
  assert.equal(f.requests[0].body.length, 100);
  await rejects(m.send({}), (e) => assert.ok(e instanceof TypeError));
});

test("receive: above the floor, opened, forgeries and replays dropped, paging while more", async () => {
  const key = link.envelopeKey("c2p");
  const e1 = await sealEnvelope(key, 1, "one");
  const e2 = await sealEnvelope(key, 2, "two");
  const forged = await sealEnvelope(other.envelopeKey("c2p"), 3, "forged");
  const e3 = await sealEnvelope(key, 3, "three");
  const f = fakeFetch(batchAnswer([e1, e2], true), batchAnswer([forged, e3], false), batchAnswer([e3], false));
  const m = mailbox(f);
  const got = await m.receive({ limit: 10 });
  assert.deepEqual(got.map((x) => [x.seq, fromUtf8(x.plaintext)]), [[1, "one"], [2, "two"], [3, "three"]]);
  assert.equal(m.readerFloor, 3);
  assert.equal(m.dropped, 1);
  assert.deepEqual(f.requests.map((r) => r.url), [`${BASE}/c2p?after=0&limit=10`, `${BASE}/c2p?after=2&limit=8`]);
  // A replay (e.g. a relay that ignores after) is dropped.
  m.readerFloor = 2;
  assert.equal(m.readerFloor, 2);
  assert.deepEqual((await m.receive()).map((x) => x.seq), [3]);
  assert.equal(f.requests[2].url, `${BASE}/c2p?after=2&limit=100`);
  assert.throws(() => (m.readerFloor = -1), RangeError);
  await rejects(m.receive({ limit: 0 }), (e) => assert.ok(e instanceof RangeError));
});

test("receive: a page that does not advance ends the paging", async () => {
  const f = fakeFetch(batchAnswer([new Uint8Array(25).fill(7)], true));
  const m = mailbox(f);
  assert.deepEqual(await m.receive(), []);
  assert.equal(m.dropped, 1);
  assert.equal(f.requests.length, 1);
});

// ---- watch ----

/** A WebSocket stand-in: the test plays the relay with open(), frame(), serverClose(). */
class FakeWS {
  static all = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.protocol = "";
    this.binaryType = "blob";
    this.sent = [];
    this.closedWith = undefined;
    FakeWS.all.push(this);
  }
  send(d) {
    if (this.readyState !== 1) throw new Error("not open");
    this.sent.push(d);
  }
  close(code, reason) {
    this.closedWith = code;
    this.readyState = 3;
  }
  open(protocol = "zerobyte.v1") {
    this.readyState = 1;
    this.protocol = protocol;
    this.onopen?.({});
  }
  frame(data) {
    this.onmessage?.({ data });
  }
  /** An error event and nothing else, as Node 20's WebSocket does for a refused connection. */
  fail() {
    this.onerror?.({});
  }
  serverClose(code, reason = "") {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
}

async function until(cond, what, ms = 3000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

const FAST = { backoffMinMs: 10, backoffMaxMs: 40, pingMs: 60_000, pongTimeoutMs: 30, stableMs: 10_000 };

// A test that fails leaves its watcher reconnecting: close them all, so
// that the process ends.
const watchers = [];
afterEach(() => {
  for (const w of watchers.splice(0)) w.close();
});

function watching(fetch = fakeFetch(), opts = {}, timing = FAST) {
  FakeWS.all = [];
  const m = new Mailbox({ relay: RELAY, app: "demo", link, role: "primary", fetch, WebSocket: FakeWS, watchTiming: timing });
  const got = { messages: [], opens: 0, errors: [] };
  const w = m.watch({
    onMessage: (x) => got.messages.push([x.seq, fromUtf8(x.plaintext)]),
    onOpen: () => got.opens++,
    onError: (e) => got.errors.push(e),
  }, opts);
  watchers.push(w);
  return { m, w, got };
}

const c2p = (seq, text, l = link) => sealEnvelope(l.envelopeKey("c2p"), seq, text).then((e) => e.buffer);

test("watch: URL, subprotocols, arraybuffer, ping at open; stored then live in order; forgeries reported, replays silent", async () => {
  const { m, w, got } = watching();
  const ws = FakeWS.all[0];
  assert.equal(ws.url, `ws://relay.test/v1/demo/mailbox/${link.id}/c2p/watch?after=0`);
  assert.deepEqual(ws.protocols, ["zerobyte.v1", `zerobyte.bearer.${link.accessToken}`]);
  assert.deepEqual([WATCH_SUBPROTOCOL, BEARER_SUBPROTOCOL], ["zerobyte.v1", "zerobyte.bearer."]);
  assert.equal(ws.binaryType, "arraybuffer");
  ws.open();
  assert.equal(got.opens, 1);
  assert.deepEqual(ws.sent, ["ping"]);
  ws.frame("pong");
  ws.frame(await c2p(1, "a"));
  ws.frame(await c2p(2, "b"));
  ws.frame(await c2p(3, "forged", other));
  ws.frame(await c2p(1, "a")); // a replay
  ws.frame(await c2p(3, "c"));
  await until(() => got.messages.length === 3, "3 messages");
  assert.deepEqual(got.messages, [[1, "a"], [2, "b"], [3, "c"]]);
  assert.equal(got.errors.length, 1);
  assert.ok(got.errors[0] instanceof SealError && got.errors[0].code === "bad_tag");
  assert.equal(m.dropped, 2);
  assert.equal(m.readerFloor, 3);
  assert.throws(() => (m.readerFloor = 0), /while a watch runs/);
  assert.throws(() => m.watch({ onMessage() {} }), /already runs/);
  w.close();
  assert.equal(ws.closedWith, 1000);
  await w.closed;
  assert.equal(w.error, undefined);
  ws.frame(await c2p(4, "late"));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(got.messages.length, 3, "nothing after close()");
  m.readerFloor = 3; // allowed again
  m.watch({ onMessage() {} }).close();
});

test("watch: a drop reconnects above the floor, with backoff; 1000 from the relay stops it", async () => {
  const { m, w, got } = watching();
  FakeWS.all[0].open();
  FakeWS.all[0].frame(await c2p(1, "a"));
  FakeWS.all[0].frame(await c2p(2, "b"));
  await until(() => got.messages.length === 2, "2 messages");
  FakeWS.all[0].serverClose(1013, "behind");
  await until(() => FakeWS.all.length === 2, "a second socket");
  assert.equal(FakeWS.all[1].url, `ws://relay.test/v1/demo/mailbox/${link.id}/c2p/watch?after=2`);
  assert.ok(got.errors[0] instanceof SocketClosedError && got.errors[0].code === 1013);
  FakeWS.all[1].open();
  assert.equal(got.opens, 2);
  FakeWS.all[1].frame(await c2p(2, "b")); // the relay resends nothing at or below after, but a replay is harmless
  FakeWS.all[1].frame(await c2p(3, "c"));
  await until(() => got.messages.length === 3, "3 messages");
  FakeWS.all[1].serverClose(1006);
  await until(() => FakeWS.all.length === 3, "a third socket");
  assert.match(FakeWS.all[2].url, /after=3$/);
  FakeWS.all[2].open();
  FakeWS.all[2].serverClose(1000, "erased");
  await w.closed;
  assert.ok(w.error instanceof SocketClosedError);
  assert.deepEqual([w.error.code, w.error.reason], [1000, "erased"]);
  assert.equal(got.errors.at(-1), w.error);
  await new Promise((r) => setTimeout(r, 60));
  assert.equal(FakeWS.all.length, 3, "no reconnect after 1000");
  assert.deepEqual(got.messages.map((x) => x[0]), [1, 2, 3]);
  assert.equal(m.dropped, 1);
});

test("watch: a socket that never opens is explained by a HEAD: 404 stops, 429 waits its Retry-After, success retries", async () => {
  const f = fakeFetch(headAnswer(0, 0, 0), answer(429, { code: "rate_limited", headers: { "Retry-After": "1" } }), answer(404, { code: "not_found" }));
  const { w, got } = watching(f, {}, { ...FAST, backoffMinMs: 1, backoffMaxMs: 2 });
  FakeWS.all[0].serverClose(1006);
  await until(() => FakeWS.all.length === 2, "a second socket");
  const t1 = Date.now();
  FakeWS.all[1].serverClose(1006);
  await until(() => FakeWS.all.length === 3, "a third socket", 4000);
  assert.ok(Date.now() - t1 >= 950, `429's Retry-After waited out: ${Date.now() - t1} ms`);
  FakeWS.all[2].serverClose(1006);
  await w.closed;
  assert.ok(w.error instanceof RelayError);
  assert.deepEqual([w.error.status, w.error.code], [404, "not_found"]);
  assert.deepEqual(f.requests.map((r) => [r.method, r.url]), Array(3).fill(["HEAD", `${BASE}/c2p`]));
  assert.equal(got.opens, 0);
  assert.equal(FakeWS.all.length, 3);
});

test("watch: backoff grows while sockets fail, capped", async () => {
  const fetch = fakeFetch(...Array.from({ length: 10 }, () => headAnswer(0, 0, 0)));
  const { w } = watching(fetch, {}, { ...FAST, backoffMinMs: 20, backoffMaxMs: 80 });
  const times = [];
  for (let i = 0; i < 5; i++) {
    const n = FakeWS.all.length;
    const t = Date.now();
    FakeWS.all[n - 1].serverClose(1006);
    await until(() => FakeWS.all.length === n + 1, `socket ${n + 1}`);
    times.push(Date.now() - t);
  }
  w.close();
  // Jitter is 50..100 % of 20, 40, 80, 80, 80.
  assert.ok(times[0] >= 9 && times[0] < 60, `first wait ${times[0]}`);
  assert.ok(times[2] >= 39, `third wait ${times[2]}`);
  assert.ok(times[4] >= 39 && times[4] < 200, `capped wait ${times[4]}`);
});

test("watch: no pong drops the socket and reconnects; foreground false sends no ping", async () => {
  const { w, got } = watching(fakeFetch(), {}, { ...FAST, pingMs: 40, pongTimeoutMs: 20 });
  FakeWS.all[0].open();
  assert.deepEqual(FakeWS.all[0].sent, ["ping"]);
  await until(() => FakeWS.all.length === 2, "a reconnect after no pong");
  assert.equal(FakeWS.all[0].closedWith, 4000);
  assert.ok(got.errors.some((e) => e instanceof SocketClosedError && e.reason === "no pong"));
  FakeWS.all[1].open();
  FakeWS.all[1].frame("pong");
  await until(() => FakeWS.all[1].sent.length === 2, "the second ping");
  FakeWS.all[1].frame("pong");
  assert.equal(FakeWS.all.length, 2);
  w.foreground = false;
  const n = FakeWS.all[1].sent.length;
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(FakeWS.all[1].sent.length, n, "no ping in the background");
  assert.equal(FakeWS.all.length, 2);
  w.close();
  await w.closed;

  const bg = watching(fakeFetch(), { foreground: false }, { ...FAST, pingMs: 10 });
  FakeWS.all[0].open();
  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(FakeWS.all[0].sent, []);
  assert.equal(bg.w.foreground, false);
  bg.w.close();
});

test("watch: another subprotocol stops it with a ProtocolError; unknown text drops the socket", async () => {
  let { w } = watching();
  FakeWS.all[0].open("zerobyte.bearer.leaked");
  await w.closed;
  assert.ok(w.error instanceof ProtocolError && w.error.code === "bad_socket");
  assert.doesNotMatch(w.error.message, /leaked/);

  ({ w } = watching());
  FakeWS.all[0].open();
  FakeWS.all[0].frame("hello");
  await until(() => FakeWS.all.length === 2, "a reconnect");
  assert.equal(FakeWS.all[0].closedWith, 4000);
  w.close();
});

test("watch: frames waiting to be opened are bounded; past the bound the socket is dropped and resumed", async () => {
  const { w, got } = watching(fakeFetch(), {}, { ...FAST, maxQueuedBytes: 100 });
  FakeWS.all[0].open();
  // Three 26-byte envelopes fit; the fourth (total 104) does not, all sent before any is opened.
  const envs = await Promise.all([1, 2, 3, 4].map((s) => c2p(s, "x")));
  for (const e of envs) FakeWS.all[0].frame(e);
  await until(() => FakeWS.all.length === 2, "a reconnect");
  assert.equal(FakeWS.all[0].closedWith, 4000);
  assert.match(FakeWS.all[1].url, /after=3$/, "resumes above what was opened");
  assert.deepEqual(got.messages.map((x) => x[0]), [1, 2, 3]);
  FakeWS.all[1].open();
  FakeWS.all[1].frame(envs[3]);
  await until(() => got.messages.length === 4, "the fourth");
  w.close();
});

test("watch: an error event without a close (Node's refused connection), a socket stuck connecting, an open socket's error without a close", async () => {
  const fetch = fakeFetch(headAnswer(0, 0, 0), headAnswer(0, 0, 0));
  const { w, got } = watching(fetch, { foreground: false }, { ...FAST, openTimeoutMs: 50, errorGraceMs: 30 });
  FakeWS.all[0].fail();
  await until(() => FakeWS.all.length === 2, "a reconnect after the error");
  assert.equal(FakeWS.all[0].closedWith, 4000);
  assert.equal(got.errors[0].code, 1006);
  // Never opens, never fails: the open timeout.
  await until(() => FakeWS.all.length === 3, "a reconnect after the open timeout");
  assert.equal(FakeWS.all[1].closedWith, 4000);
  assert.equal(got.errors[1].reason, "open timeout");
  assert.equal(fetch.requests.length, 2, "both failed opens probed with a HEAD");
  FakeWS.all[2].open();
  FakeWS.all[2].fail();
  await until(() => FakeWS.all.length === 4, "a reconnect after an error with no close");
  assert.equal(FakeWS.all[2].closedWith, 4000);
  FakeWS.all[3].open();
  FakeWS.all[3].fail();
  FakeWS.all[3].serverClose(1011, "boom"); // the close comes: no second reconnect from the grace timer
  await until(() => FakeWS.all.length === 5, "a reconnect after the close");
  FakeWS.all[4].open();
  await new Promise((r) => setTimeout(r, 80));
  assert.equal(FakeWS.all.length, 5);
  assert.equal(got.errors.at(-1).code, 1011);
  w.close();
  assert.equal(FakeWS.all[4].closedWith, 1000);
  await w.closed;
});

test("watch: an exception of onMessage goes to onError and the watch goes on", async () => {
  FakeWS.all = [];
  const errors = [];
  const seen = [];
  const m = new Mailbox({ relay: RELAY, app: "demo", link, role: "primary", fetch: fakeFetch(), WebSocket: FakeWS, watchTiming: FAST });
  const w = m.watch({ onMessage: (x) => { seen.push(x.seq); if (x.seq === 1) throw new Error("app bug"); }, onError: (e) => errors.push(e) });
  FakeWS.all[0].open();
  FakeWS.all[0].frame(await c2p(1, "a"));
  FakeWS.all[0].frame(await c2p(2, "b"));
  await until(() => seen.length === 2, "both");
  assert.equal(errors[0].message, "app bug");
  w.close();
});

test("watch: no WebSocket available is a TypeError", () => {
  const saved = globalThis.WebSocket;
  globalThis.WebSocket = undefined;
  try {
    assert.throws(() => new Mailbox({ relay: RELAY, app: "demo", link, role: "primary" }).watch({ onMessage() {} }), TypeError);
  } finally {
    globalThis.WebSocket = saved;
  }
});
