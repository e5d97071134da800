// SignalChannel and fetchIce against the real relay (run by
// e2e/signal_node_test.go): env MAILBOX (origin), TURN_ADDR (host:port),
// TURN_SECRET. Prints "ICE <json>" for the Go side, which allocates on the
// relay's TURN server with the credential; exits non-zero on any failure.
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { SignalChannel } from "../../dist/signal.js";
import { fetchIce, rtcConfiguration } from "../../dist/ice.js";
import { SignalSealer } from "../../dist/signalseal.js";
import { SocketClosedError } from "../../dist/errors.js";
import { Link } from "../../dist/link.js";
import { fromUtf8 } from "../../dist/bytes.js";

const MAILBOX = process.env.MAILBOX;
const TURN_ADDR = process.env.TURN_ADDR;
const TURN_SECRET = process.env.TURN_SECRET;
assert.ok(MAILBOX && TURN_ADDR && TURN_SECRET, "MAILBOX, TURN_ADDR, TURN_SECRET");
const APP = "demo";

async function until(cond, what, ms = 10_000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** A side's channel with everything it hears recorded. */
async function side(link, role) {
  const ch = await SignalChannel.open({ relay: MAILBOX, app: APP, link, role });
  const rec = { ch, peers: [], got: [], closed: null };
  ch.onpeer = (p) => rec.peers.push(p);
  ch.onmessage = (m) => rec.got.push(fromUtf8(m));
  ch.onclose = (code, reason) => (rec.closed = { code, reason });
  return rec;
}

const link = await Link.generate();
const base = `${MAILBOX}/v1/${APP}/mailbox/${link.id}`;
const auth = { Authorization: `Bearer ${link.accessToken}` };

// No mailbox yet: the upgrade is refused (404), which a WebSocket sees as 1006.
await assert.rejects(SignalChannel.open({ relay: MAILBOX, app: APP, link, role: "primary" }), (e) => e instanceof SocketClosedError && e.code === 1006);
const claim = await fetch(base, { method: "PUT", headers: auth });
assert.equal(claim.status, 201, "claim");

// Peer 1 on both once both are there.
const p = await side(link, "primary");
assert.equal(p.ch.peerPresent, false);
const c = await side(link, "companion");
await until(() => p.ch.peerPresent && c.ch.peerPresent, "peer 1 on both");
assert.deepEqual(p.peers, [true]);
assert.deepEqual(c.peers, [true]);

// Sealed frames both ways, in order, the biggest the relay forwards among them.
const many = Array.from({ length: 30 }, (_, i) => `p2c ${i} ` + "z".repeat((i * 4099) % 60_000));
await Promise.all(many.map((m) => p.ch.send(m)));
await c.ch.send("c2p hello");
await until(() => c.got.length === 30 && p.got.length === 1, "frames both ways");
assert.deepEqual(c.got, many);
assert.deepEqual(p.got, ["c2p hello"]);
assert.equal(c.ch.dropped + p.ch.dropped, 0);
// At the relay's limit: a 64 KiB frame is refused before it is sent.
await assert.rejects(p.ch.send(new Uint8Array(64 * 1024 - 25 + 1)), RangeError);
await p.ch.send(new Uint8Array(64 * 1024 - 25)); // exactly 64 KiB sealed: forwarded
await until(() => c.got.length === 31, "the 64 KiB frame");

// A forger with the bearer but not the keys: a plain WebSocket on the
// primary's side replaces the primary (4000 "replaced") and sends frames
// the companion must drop: another link's key, garbage, a stale counter, a
// counter at or below the last accepted.
const forger = new WebSocket(`${base.replace(/^http/, "ws")}/signal/primary`, ["zerobyte.v1", `zerobyte.bearer.${link.accessToken}`]);
forger.binaryType = "arraybuffer";
await new Promise((resolve, reject) => {
  forger.onopen = resolve;
  forger.onclose = (e) => reject(new Error(`forger closed ${e.code}`));
});
assert.equal(forger.protocol, "zerobyte.v1", "the relay answers zerobyte.v1, never the bearer");
await until(() => p.closed, "the replaced primary closed");
assert.deepEqual(p.closed, { code: 4000, reason: "replaced" });
const other = await Link.generate();
forger.send(await new SignalSealer(other.signalKey("p2c")).seal("forged"));
forger.send(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
forger.send(await new SignalSealer(link.signalKey("p2c"), () => Date.now() - 301_000).seal("stale"));
forger.send(await new SignalSealer(link.signalKey("p2c"), () => Date.now() - 60_000).seal("replayed counter"));
await until(() => c.ch.dropped === 4, "4 frames dropped", 5000);
assert.equal(c.got.length, 31, "nothing forged delivered");

// The primary comes back (replacing the forger) and is heard again.
const forgerClosed = new Promise((r) => (forger.onclose = (e) => r([e.code, e.reason])));
const p2 = await side(link, "primary");
assert.deepEqual(await forgerClosed, [4000, "replaced"]);
await until(() => p2.ch.peerPresent, "peer 1 for the new primary");
await p2.ch.send("after the forger");
await until(() => c.got.length === 32, "the new primary's frame");
assert.equal(c.got[31], "after the forger");
assert.equal(c.ch.dropped, 4);

// Peer 0 to the side left when the other closes.
c.ch.close();
await until(() => p2.peers.at(-1) === false, "peer 0");
assert.equal(p2.ch.peerPresent, false);
await until(() => c.closed, "companion closed");
assert.equal(c.closed.code, 1000);
assert.equal(p2.closed, null);

// ICE: our TURN server, a coturn REST credential under the shared secret.
const ice = await fetchIce({ relay: MAILBOX, app: APP, link });
assert.ok(ice.ttl > 0);
const turn = ice.iceServers.find((s) => [].concat(s.urls).some((u) => u.startsWith("turn:")));
assert.ok(turn, `no turn: server in ${JSON.stringify(ice)}`);
const urls = [].concat(turn.urls);
assert.ok(urls.some((u) => u === `turn:${TURN_ADDR}?transport=udp`), `turn urls ${urls}`);
const [expiry, label] = turn.username.split(":");
const now = Math.floor(Date.now() / 1000);
assert.ok(/^\d+$/.test(expiry) && label, `username ${turn.username}`);
assert.ok(Number(expiry) > now && Number(expiry) <= now + ice.ttl + 5, `expiry ${expiry}, now ${now}, ttl ${ice.ttl}`);
assert.equal(turn.credential, createHmac("sha1", TURN_SECRET).update(turn.username).digest("base64"), "credential = base64(HMAC-SHA1(secret, username))");
const cfg = rtcConfiguration(ice, { relayOnly: true });
assert.equal(cfg.iceTransportPolicy, "relay");
assert.deepEqual(cfg.iceServers, ice.iceServers);
assert.equal(rtcConfiguration(ice).iceTransportPolicy, "all");
console.log(`ICE ${JSON.stringify({ urls, username: turn.username, credential: turn.credential })}`);

p2.ch.close();
await until(() => p2.closed, "primary closed");
console.log("signal ok");
