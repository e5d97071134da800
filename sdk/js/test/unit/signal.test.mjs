// SignalChannel, fetchIce/rtcConfiguration and connect() against fakes: a
// fake signal relay (two sides, peer 1/peer 0, forwarding, replacement) in
// place of the WebSocket, a fake fetch for ICE, and a fake
// RTCPeerConnection pair that opens its data channel only once both
// descriptions and at least one trickled candidate each way have arrived in
// a legal order. The real relay: test/node/signal.mjs; real WebRTC: the
// browser tests.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SignalChannel, socketURL, SIGNAL_PING_MS } from "../../dist/signal.js";
import { fetchIce, rtcConfiguration } from "../../dist/ice.js";
import { connect } from "../../dist/connect.js";
import { SignalOpener, SignalSealer } from "../../dist/signalseal.js";
import { SocketClosedError, RelayError } from "../../dist/errors.js";
import { Link } from "../../dist/link.js";
import { fromUtf8, utf8 } from "../../dist/bytes.js";

const later = (f) => setTimeout(f, 0);

/** A wait for cond with a deadline (no fixed sleeps). */
async function until(cond, what, ms = 3000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/**
 * A fake of the relay's signal endpoint. Each FakeWS opens against it; a
 * side whose URL, subprotocols or bearer are wrong is refused (closed with
 * 1006 before open, as a browser reports a refused upgrade).
 */
class FakeSignalRelay {
  constructor(link) {
    this.link = link;
    this.sides = { primary: null, companion: null };
    this.log = []; // {from, data} of every message a side sent
    this.urls = [];
    const relay = this;
    this.WebSocket = class FakeWS {
      constructor(url, protocols) {
        this.url = url;
        this.protocols = protocols;
        this.readyState = 0;
        this.binaryType = "blob";
        this.onopen = this.onmessage = this.onclose = this.onerror = null;
        relay.urls.push(url);
        later(() => relay.accept(this));
      }
      send(data) {
        if (this.readyState !== 1) throw new Error("fake ws: send while not open");
        relay.fromSide(this, data);
      }
      close(code = 1005, reason = "") {
        if (this.readyState >= 2) return;
        this.readyState = 2;
        later(() => relay.drop(this, code, reason));
      }
    };
  }
  accept(ws) {
    const m = /^ws:\/\/relay\.test\/v1\/demo\/mailbox\/([^/]+)\/signal\/(primary|companion)$/.exec(ws.url);
    const ok = m && m[1] === this.link.id && ws.protocols.length === 2 && ws.protocols[0] === "zerobyte.v1" &&
      ws.protocols[1] === `zerobyte.bearer.${this.link.accessToken}` && !this.refuse;
    if (!ok) {
      ws.readyState = 3;
      ws.onerror?.({});
      ws.onclose?.({ code: 1006, reason: "" });
      return;
    }
    const side = m[2];
    ws.side = side;
    const old = this.sides[side];
    this.sides[side] = ws;
    ws.readyState = 1;
    ws.onopen?.({});
    if (old) this.drop(old, 4000, "replaced", true);
    const other = this.sides[other_(side)];
    if (other) {
      this.text(ws, "peer 1");
      this.text(other, "peer 1");
    }
  }
  text(ws, s) {
    later(() => ws.readyState === 1 && ws.onmessage?.({ data: s }));
  }
  fromSide(ws, data) {
    this.log.push({ from: ws.side, data });
    if (typeof data === "string") {
      if (data === "ping") this.text(ws, "pong");
      else this.drop(ws, 1003, "");
      return;
    }
    const other = this.sides[other_(ws.side)];
    if (other) this.binary(other, data);
  }
  /** Delivers bytes to ws as the relay forwards them (an ArrayBuffer copy, as binaryType "arraybuffer" gives). */
  binary(ws, bytes) {
    assert.equal(ws.binaryType, "arraybuffer", "the channel asks for ArrayBuffers");
    const copy = bytes.slice().buffer;
    later(() => ws.readyState === 1 && ws.onmessage?.({ data: copy }));
  }
  /** The relay closes ws (or completes the side's own close). */
  drop(ws, code, reason, replaced = false) {
    if (ws.readyState === 3) return;
    ws.readyState = 3;
    const side = ws.side;
    if (!replaced && this.sides[side] === ws) {
      this.sides[side] = null;
      const other = this.sides[other_(side)];
      if (other) this.text(other, "peer 0");
    }
    later(() => ws.onclose?.({ code, reason }));
  }
}

function other_(side) {
  return side === "primary" ? "companion" : "primary";
}

const RELAY = "http://relay.test";

async function pair() {
  const link = await Link.generate();
  const relay = new FakeSignalRelay(link);
  const opts = (role) => ({ relay: RELAY, app: "demo", link, role, WebSocket: relay.WebSocket });
  return { link, relay, opts };
}

test("socketURL maps http(s) to ws(s) and refuses other schemes", () => {
  assert.equal(socketURL("http://a.test:8080", "/v1/x"), "ws://a.test:8080/v1/x");
  assert.equal(socketURL("https://a.test", "/v1/x"), "wss://a.test/v1/x");
  assert.equal(socketURL("wss://a.test/", "/v1/x"), "wss://a.test/v1/x");
  assert.throws(() => socketURL("ftp://a.test", "/v1/x"), TypeError);
});

test("two sides: peer 1, sealed frames both ways in order, peer 0 when one closes", async () => {
  const { link, relay, opts } = await pair();
  const p = await SignalChannel.open(opts("primary"));
  assert.equal(relay.urls[0], `ws://relay.test/v1/demo/mailbox/${link.id}/signal/primary`);
  assert.equal(p.peerPresent, false);
  const peersP = [];
  p.onpeer = (x) => peersP.push(x);
  const c = await SignalChannel.open(opts("companion"));
  const peersC = [];
  c.onpeer = (x) => peersC.push(x);
  await until(() => p.peerPresent && c.peerPresent, "peer 1 on both");
  assert.deepEqual(peersP, [true]);

  const atC = [], atP = [];
  c.onmessage = (m) => atC.push(fromUtf8(m));
  p.onmessage = (m) => atP.push(fromUtf8(m));
  // Many sends at once, of very different sizes: WebCrypto may finish them
  // out of order, the channel must not.
  const sent = [];
  for (let i = 0; i < 40; i++) sent.push(`p${i} ` + "x".repeat((i * 997) % 20000));
  await Promise.all(sent.map((m) => p.send(m)));
  await c.send("from the companion");
  await until(() => atC.length === 40 && atP.length === 1, "all frames");
  assert.deepEqual(atC, sent);
  assert.deepEqual(atP, ["from the companion"]);
  assert.equal(p.dropped + c.dropped, 0);

  // What the relay saw is sealed: the primary's frames open only with the
  // p2c signal key, never the c2p one.
  const frames = relay.log.filter((e) => e.from === "primary" && typeof e.data !== "string");
  assert.equal(frames.length, 40);
  assert.ok(!Buffer.from(frames[0].data).includes("p0 "), "plaintext on the wire");
  const opener = new SignalOpener(link.signalKey("p2c"));
  assert.equal(fromUtf8(await opener.open(frames[0].data)), sent[0]);
  await assert.rejects(new SignalOpener(link.signalKey("c2p")).open(frames[1].data), { code: "bad_tag" });

  let closed;
  p.onclose = (code, reason) => (closed = [code, reason]);
  c.close();
  await until(() => peersP.length === 2, "peer 0");
  assert.deepEqual(peersP, [true, false]);
  assert.equal(p.peerPresent, false);
  assert.equal(closed, undefined);
  await until(() => c.closed, "companion closed");
  assert.equal(c.peerPresent, false);
  await assert.rejects(c.send("late"), SocketClosedError);
  p.close();
  await until(() => p.closed, "primary closed");
});

test("forged, replayed and stale frames are dropped and counted; good ones still pass", async () => {
  const { link, relay, opts } = await pair();
  const p = await SignalChannel.open(opts("primary"));
  const c = await SignalChannel.open(opts("companion"));
  await until(() => c.peerPresent, "peer 1");
  const got = [];
  c.onmessage = (m) => got.push(fromUtf8(m));
  const inject = (bytes) => relay.binary(relay.sides.companion, bytes);

  const other = await Link.generate();
  inject(await new SignalSealer(other.signalKey("p2c")).seal("forged: another link's key"));
  inject(await new SignalSealer(link.signalKey("c2p")).seal("forged: the companion's own direction"));
  inject(utf8("not a frame"));
  await p.send("one");
  await until(() => got.length === 1, "first good frame");
  const replay = relay.log.filter((e) => e.from === "primary").at(-1).data;
  inject(replay);
  const stale = await new SignalSealer(link.signalKey("p2c"), () => Date.now() - 301_000).seal("stale");
  inject(stale);
  await p.send("two");
  await until(() => got.length === 2, "second good frame");
  await until(() => c.dropped === 5, "5 dropped");
  assert.deepEqual(got, ["one", "two"]);
  assert.equal(p.dropped, 0);
  p.close();
  c.close();
});

test("a second socket for one side replaces the first: 4000 replaced", async () => {
  const { opts } = await pair();
  const p1 = await SignalChannel.open(opts("primary"));
  const c = await SignalChannel.open(opts("companion"));
  await until(() => p1.peerPresent, "peer 1");
  let closed;
  p1.onclose = (code, reason) => (closed = [code, reason]);
  const p2 = await SignalChannel.open(opts("primary"));
  await until(() => closed, "the first socket closed");
  assert.deepEqual(closed, [4000, "replaced"]);
  await until(() => p2.peerPresent, "peer 1 for the new socket");
  const got = [];
  p2.onmessage = (m) => got.push(fromUtf8(m));
  await c.send("to the new one");
  await until(() => got.length === 1, "frame at the new socket");
  p2.close();
  c.close();
});

test("a refused upgrade rejects open with SocketClosedError 1006", async () => {
  const { link, relay, opts } = await pair();
  relay.refuse = true;
  await assert.rejects(SignalChannel.open(opts("primary")), (e) => e instanceof SocketClosedError && e.code === 1006);
  relay.refuse = false;
  const wrong = await Link.generate(); // another link's bearer: the fake refuses it
  await assert.rejects(SignalChannel.open({ ...opts("primary"), link: wrong }), SocketClosedError);
  assert.throws(() => SignalChannel.open({ ...opts("primary"), role: "other" }), TypeError);
  assert.ok(link);
});

test("text ping every 20 s while open, none after close", async (t) => {
  t.mock.timers.enable({ apis: ["setInterval"] });
  const { relay, opts } = await pair();
  const p = await SignalChannel.open(opts("primary"));
  const pings = () => relay.log.filter((e) => e.data === "ping").length;
  t.mock.timers.tick(SIGNAL_PING_MS - 1);
  assert.equal(pings(), 0);
  t.mock.timers.tick(1);
  assert.equal(pings(), 1);
  t.mock.timers.tick(SIGNAL_PING_MS);
  assert.equal(pings(), 2);
  p.close();
  t.mock.timers.tick(SIGNAL_PING_MS * 3);
  assert.equal(pings(), 2);
});

// ---- ICE ----------------------------------------------------------------

const ICE_BODY = {
  iceServers: [{ urls: ["stun:127.0.0.1:3478"] }, { urls: ["turn:127.0.0.1:3478?transport=udp"], username: "1700000000:x", credential: "abc=" }],
  ttl: 3600,
};

function fakeFetch(status, body, seen = []) {
  return async (url, init) => {
    seen.push({ url, init });
    return new Response(typeof body === "string" ? body : JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
  };
}

test("fetchIce: GET …/ice with the bearer; errors are RelayError; rtcConfiguration", async () => {
  const link = await Link.generate();
  const seen = [];
  const ice = await fetchIce({ relay: RELAY, app: "demo", link, fetch: fakeFetch(200, ICE_BODY, seen) });
  assert.deepEqual(ice, ICE_BODY);
  assert.equal(seen[0].url, `http://relay.test/v1/demo/mailbox/${link.id}/ice`);
  assert.equal(seen[0].init.headers.Authorization, `Bearer ${link.accessToken}`);
  await assert.rejects(fetchIce({ relay: RELAY, app: "demo", link, fetch: fakeFetch(429, { error: "rate_limited", status: 429 }) }),
    (e) => e instanceof RelayError && e.status === 429 && e.code === "rate_limited");
  await assert.rejects(fetchIce({ relay: RELAY, app: "demo", link, fetch: fakeFetch(404, { error: "not_found", status: 404 }) }),
    (e) => e instanceof RelayError && e.status === 404);
  await assert.rejects(fetchIce({ relay: RELAY, app: "demo", link, fetch: fakeFetch(200, { iceServers: "x", ttl: 1 }) }), TypeError);
  await assert.rejects(fetchIce({ relay: RELAY, app: "demo", link, fetch: fakeFetch(200, { iceServers: [{}], ttl: 1 }) }), TypeError);
  await assert.rejects(fetchIce({ relay: RELAY, app: "demo", link, fetch: fakeFetch(200, { iceServers: [], ttl: 0 }) }), TypeError);

  assert.deepEqual(rtcConfiguration(ice), { iceServers: ICE_BODY.iceServers, iceTransportPolicy: "all" });
  assert.equal(rtcConfiguration(ice, { relayOnly: true }).iceTransportPolicy, "relay");
});

// ---- connect() ----------------------------------------------------------

/**
 * A fake RTCPeerConnection network. Each pc trickles two candidates (and
 * the end-of-candidates null) after setLocalDescription; addIceCandidate
 * before setRemoteDescription throws as browsers do (recorded in errors).
 * Two pcs connect once each holds the other's description and at least
 * one of its candidates, and the network is up: the offerer's data channel
 * opens and the answerer gets ondatachannel.
 */
function fakeNetwork() {
  const net = { up: true, pcs: [], errors: [] };
  let nextId = 0;
  class FakeChannel extends EventTarget {
    constructor(label) {
      super();
      this.label = label;
      this.readyState = "connecting";
      this.binaryType = "blob";
    }
    open() {
      this.readyState = "open";
      this.dispatchEvent(new Event("open"));
    }
  }
  net.RTCPeerConnection = class FakePC {
    constructor(config) {
      this.id = `pc${++nextId}`;
      this.config = config;
      this.log = [];
      this.localDescription = null;
      this.remoteDescription = null;
      this.remoteId = null;
      this.candidatesFrom = new Set();
      this.closed = false;
      this.channel = null;
      this.onicecandidate = this.ondatachannel = null;
      net.pcs.push(this);
    }
    createDataChannel(label) {
      this.log.push("createDataChannel");
      this.channel = new FakeChannel(label);
      return this.channel;
    }
    async createOffer() {
      this.log.push("createOffer");
      return { type: "offer", sdp: `fake-offer ${this.id}` };
    }
    async createAnswer() {
      this.log.push("createAnswer");
      if (this.remoteDescription?.type !== "offer") throw new Error("InvalidStateError: createAnswer without an offer");
      return { type: "answer", sdp: `fake-answer ${this.id}` };
    }
    async setLocalDescription(d) {
      this.log.push(`setLocal ${d.type}`);
      this.localDescription = d;
      later(() => {
        for (const k of [1, 2]) {
          const c = { candidate: `candidate:${k} 1 udp 1 127.0.0.1 ${4000 + k} typ host ${this.id}`, sdpMid: "0", sdpMLineIndex: 0 };
          this.onicecandidate?.({ candidate: { ...c, toJSON: () => c } });
        }
        this.onicecandidate?.({ candidate: null });
      });
    }
    async setRemoteDescription(d) {
      this.log.push(`setRemote ${d.type}`);
      this.remoteDescription = d;
      this.remoteId = d.sdp.split(" ")[1];
      this.check();
    }
    async addIceCandidate(c) {
      if (!this.remoteDescription) {
        net.errors.push(`${this.id}: addIceCandidate before setRemoteDescription`);
        throw new Error("InvalidStateError");
      }
      const from = c.candidate.split(" ").at(-1);
      this.log.push(`addIceCandidate ${from}`);
      this.candidatesFrom.add(from);
      this.check();
    }
    close() {
      this.closed = true;
      this.log.push("close");
    }
    check() {
      const peer = net.pcs.find((q) => q.id === this.remoteId);
      if (!net.up || !peer || peer.remoteId !== this.id || this.closed || peer.closed) return;
      if (!this.candidatesFrom.has(peer.id) || !peer.candidatesFrom.has(this.id)) return;
      if (this.connected || peer.connected) return;
      this.connected = peer.connected = true;
      const [offerer, answerer] = this.channel ? [this, peer] : [peer, this];
      later(() => {
        offerer.channel.open();
        const ch = new FakeChannel(offerer.channel.label);
        answerer.ondatachannel?.({ channel: ch });
        later(() => ch.open());
      });
    }
  };
  return net;
}

async function connectPair({ companionFirst = false } = {}) {
  const { link, relay, opts } = await pair();
  const net = fakeNetwork();
  const seen = [];
  const extra = { fetch: fakeFetch(200, ICE_BODY, seen), RTCPeerConnection: net.RTCPeerConnection, relayOnly: true, label: "chat", timeoutMs: 5000 };
  const first = companionFirst ? "companion" : "primary";
  const a = connect({ ...opts(first), ...extra });
  await until(() => relay.sides[first], `${first} on the signal channel`);
  const b = connect({ ...opts(other_(first)), ...extra });
  const [x, y] = await Promise.all([a, b]);
  const [p, c] = companionFirst ? [y, x] : [x, y];
  return { link, relay, net, p, c, seen };
}

/** The rendezvous messages one side sent, opened with a fresh opener of its direction. */
async function rendezvous(link, relay, side) {
  const opener = new SignalOpener(link.signalKey(side === "primary" ? "p2c" : "c2p"));
  const out = [];
  for (const e of relay.log) {
    if (e.from === side && typeof e.data !== "string") out.push(JSON.parse(fromUtf8(await opener.open(e.data))));
  }
  return out;
}

for (const companionFirst of [false, true]) {
  test(`connect: the primary offers, the companion answers, candidates trickle (${companionFirst ? "companion" : "primary"} first)`, async () => {
    const { link, relay, net, p, c, seen } = await connectPair({ companionFirst });
    assert.equal(p.channel.readyState, "open");
    assert.equal(c.channel.readyState, "open");
    assert.equal(p.channel.binaryType, "arraybuffer");
    assert.equal(c.channel.binaryType, "arraybuffer");
    assert.equal(c.channel.label, "chat");
    assert.deepEqual(net.errors, []);
    assert.equal(net.pcs.length, 2);
    assert.equal(p.pc.config.iceTransportPolicy, "relay");
    assert.deepEqual(p.pc.config.iceServers, ICE_BODY.iceServers);
    assert.equal(seen.length, 2);
    assert.deepEqual(p.pc.log.slice(0, 3), ["createDataChannel", "createOffer", "setLocal offer"]);
    assert.deepEqual(c.pc.log.slice(0, 3), ["setRemote offer", "createAnswer", "setLocal answer"]);

    const fromP = await rendezvous(link, relay, "primary");
    const fromC = await rendezvous(link, relay, "companion");
    assert.equal(fromP[0].type, "offer");
    assert.equal(fromP[0].sdp, `fake-offer ${p.pc.id}`);
    assert.equal(fromC[0].type, "answer");
    assert.equal(fromC[0].n, fromP[0].n);
    // Candidates only after the description, all of the attempt.
    for (const m of [...fromP.slice(1), ...fromC.slice(1)]) {
      assert.equal(m.type, "candidate");
      assert.equal(m.n, fromP[0].n);
    }
    assert.ok(fromP.length >= 2 && fromC.length >= 2, "candidates were trickled both ways");
    // The signal channel stays open and is the app's now.
    assert.equal(p.signal.onmessage, null);
    const got = [];
    c.signal.onmessage = (m) => got.push(fromUtf8(m));
    await p.signal.send("app message");
    await until(() => got.length === 1, "app message on the signal channel");
    p.signal.close();
    c.signal.close();
  });
}

test("connect: the primary offers again, on a fresh peer connection, when the companion comes back", async () => {
  const { link, relay, opts } = await pair();
  const net = fakeNetwork();
  net.up = false; // the first attempt cannot connect
  const extra = { fetch: fakeFetch(200, ICE_BODY), RTCPeerConnection: net.RTCPeerConnection, timeoutMs: 5000 };
  const p = connect({ ...opts("primary"), ...extra });
  await until(() => relay.sides.primary, "primary on the signal channel");
  const c1 = connect({ ...opts("companion"), ...extra });
  await until(() => net.pcs.length === 2 && net.pcs[1].localDescription, "the first attempt's answer");
  // The companion goes away (its socket drops) before the channel opened.
  relay.drop(relay.sides.companion, 1006, "");
  await assert.rejects(c1, /signal channel closed \(1006\)/);
  net.up = true;
  const c2 = connect({ ...opts("companion"), ...extra });
  const [pp, cc] = await Promise.all([p, c2]);
  assert.equal(net.pcs.length, 4);
  const [pcP1, pcC1, pcP2, pcC2] = net.pcs;
  assert.ok(pcP1.closed && pcC1.closed, "the first attempt's peer connections are closed");
  assert.equal(pp.pc, pcP2);
  assert.equal(cc.pc, pcC2);
  const offers = (await rendezvous(link, relay, "primary")).filter((m) => m.type === "offer");
  assert.equal(offers.length, 2);
  assert.notEqual(offers[0].n, offers[1].n);
  assert.deepEqual(net.errors, []);
  pp.signal.close();
  cc.signal.close();
});

test("connect: timeout without a peer rejects and closes the signal channel", async () => {
  const { relay, opts } = await pair();
  const net = fakeNetwork();
  const p = connect({ ...opts("primary"), fetch: fakeFetch(200, ICE_BODY), RTCPeerConnection: net.RTCPeerConnection, timeoutMs: 100 });
  await assert.rejects(p, /no open data channel within 100 ms/);
  await until(() => relay.sides.primary === null, "signal socket closed");
  assert.equal(net.pcs.length, 0);
});

test("connect: an ICE error rejects before any socket opens", async () => {
  const { relay, opts } = await pair();
  const net = fakeNetwork();
  await assert.rejects(connect({ ...opts("primary"), fetch: fakeFetch(404, { error: "not_found", status: 404 }), RTCPeerConnection: net.RTCPeerConnection }), RelayError);
  assert.equal(relay.urls.length, 0);
  // Node has no RTCPeerConnection: without one injected, a TypeError.
  await assert.rejects(connect({ ...opts("primary"), fetch: fakeFetch(200, ICE_BODY) }), TypeError);
});
