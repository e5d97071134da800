// connect(): a WebRTC data channel between the two devices of a link, with
// the mailbox's signal channel as the rendezvous and its ICE endpoint for
// STUN/TURN. The roles are fixed, so there is no glare to resolve: the
// primary offers (and creates the data channel) whenever the companion is
// there, the companion answers each offer with a fresh peer connection.
//
// Messages on the signal channel are sealed JSON (signal.ts seals them):
//   {"type":"offer","n":<attempt>,"sdp":…}
//   {"type":"answer","n":<attempt>,"sdp":…}
//   {"type":"candidate","n":<attempt>,"candidate":<RTCIceCandidateInit>}
// n names the primary's attempt (random, fresh for each offer), so that
// the answer and the candidates of an abandoned attempt (the companion
// left and came back, or either side restarted) are ignored.

import { fetchIce, rtcConfiguration } from "./ice.js";
import { SignalChannel, type SignalOptions } from "./signal.js";
import { fromUtf8 } from "./bytes.js";

/** Options of connect(): the signal channel's, plus the WebRTC ones. */
export interface ConnectOptions extends SignalOptions {
  /** fetch for the ICE request (default globalThis.fetch). */
  fetch?: typeof fetch;
  /** Only TURN candidates (iceTransportPolicy "relay"). */
  relayOnly?: boolean;
  /** The data channel's label (the primary creates it): default "edgerelay". */
  label?: string;
  /** How long to wait for the data channel to open, in ms: default 30000. */
  timeoutMs?: number;
  /** The RTCPeerConnection class (default globalThis.RTCPeerConnection). */
  RTCPeerConnection?: typeof RTCPeerConnection;
}

/** What connect() resolves with. */
export interface Connection {
  pc: RTCPeerConnection;
  /** The open data channel (binaryType "arraybuffer"). */
  channel: RTCDataChannel;
  /** The signal channel, still open; connect()'s handlers are removed from it, so the app may use it. */
  signal: SignalChannel;
}

/** A rendezvous message (see the top of this file). */
type Msg =
  | { type: "offer" | "answer"; n: string; sdp: string }
  | { type: "candidate"; n: string; candidate: RTCIceCandidateInit };

/** connect()'s default wait for the data channel, in ms. */
export const CONNECT_TIMEOUT_MS = 30_000;

/**
 * Fetches ICE servers and opens the signal channel, then negotiates a peer
 * connection: the primary offers once the companion is there ("peer 1"),
 * again with a fresh peer connection whenever the companion comes back
 * before the channel opened; the companion answers. Candidates are
 * trickled both ways (and held until the remote description is set).
 * Resolves when the data channel is open; rejects, closing everything it
 * opened, when the signal channel closes first, on timeoutMs, or with the
 * error of the signal channel or the ICE request.
 */
export async function connect(o: ConnectOptions): Promise<Connection> {
  const PC = o.RTCPeerConnection ?? globalThis.RTCPeerConnection;
  if (typeof PC !== "function") throw new TypeError("connect: no RTCPeerConnection (pass options.RTCPeerConnection)");
  // ICE first: once the signal channel is open the other side may send
  // at once, and a message that arrives before the handlers are set is
  // lost; the Negotiation takes the channel over in the same task that
  // sees it open.
  const config = rtcConfiguration(await fetchIce(o), { relayOnly: o.relayOnly ?? false });
  const signal = await SignalChannel.open(o);
  return new Negotiation(o, PC, config, signal).result;
}

/** One connect() call's state. */
class Negotiation {
  readonly result: Promise<Connection>;
  #resolve!: (c: Connection) => void;
  #reject!: (e: Error) => void;
  readonly #o: ConnectOptions;
  readonly #PC: typeof RTCPeerConnection;
  readonly #config: RTCConfiguration;
  readonly #signal: SignalChannel;
  readonly #timer: ReturnType<typeof setTimeout>;
  #done = false;
  // The current attempt: its peer connection, its name, whether its remote
  // description is set (candidates before it are held in #remoteHeld), and
  // whether its own description went out (candidates before it are held in
  // #localHeld, so that the other side gets the description first).
  #pc: RTCPeerConnection | null = null;
  #n = "";
  #remoteSet = false;
  #remoteHeld: RTCIceCandidateInit[] = [];
  #localSent = false;
  #localHeld: RTCIceCandidateInit[] = [];
  // Incoming messages are handled one at a time: each awaits WebRTC calls,
  // and a candidate must not overtake the offer it belongs to.
  #queue: Promise<void> = Promise.resolve();

  constructor(o: ConnectOptions, PC: typeof RTCPeerConnection, config: RTCConfiguration, signal: SignalChannel) {
    this.#o = o;
    this.#PC = PC;
    this.#config = config;
    this.#signal = signal;
    this.result = new Promise((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    const ms = o.timeoutMs ?? CONNECT_TIMEOUT_MS;
    this.#timer = setTimeout(() => this.#fail(new Error(`connect: no open data channel within ${ms} ms (peer present: ${signal.peerPresent})`)), ms);
    signal.onclose = (code, reason) => this.#fail(new Error(`connect: signal channel closed (${code}${reason ? " " + reason : ""}) before the data channel opened`));
    signal.onmessage = (plaintext) => {
      this.#queue = this.#queue.then(() => this.#handle(plaintext)).catch((e) => this.#fail(e as Error));
    };
    signal.onpeer = (present) => {
      if (present && o.role === "primary") this.#serial(() => this.#offer());
    };
    if (signal.peerPresent && o.role === "primary") this.#serial(() => this.#offer());
  }

  #serial(f: () => Promise<void>): void {
    this.#queue = this.#queue.then(f).catch((e) => this.#fail(e as Error));
  }

  /** A fresh peer connection for attempt n, replacing the current one. */
  #fresh(n: string): RTCPeerConnection {
    this.#pc?.close();
    const pc = new this.#PC(this.#config);
    this.#pc = pc;
    this.#n = n;
    this.#remoteSet = false;
    this.#remoteHeld = [];
    this.#localSent = false;
    this.#localHeld = [];
    pc.onicecandidate = (e) => {
      if (this.#pc !== pc || this.#done || !e.candidate) return;
      const c = typeof e.candidate.toJSON === "function" ? e.candidate.toJSON() : candidateInit(e.candidate);
      if (this.#localSent) this.#send({ type: "candidate", n, candidate: c });
      else this.#localHeld.push(c);
    };
    if (this.#o.role === "primary") {
      this.#watch(pc, pc.createDataChannel(this.#o.label ?? "edgerelay"));
    } else {
      pc.ondatachannel = (e) => this.#watch(pc, e.channel);
    }
    return pc;
  }

  #watch(pc: RTCPeerConnection, channel: RTCDataChannel): void {
    channel.binaryType = "arraybuffer";
    const opened = () => {
      if (this.#pc === pc) this.#finish(pc, channel);
    };
    if (channel.readyState === "open") opened();
    else channel.addEventListener("open", opened, { once: true });
  }

  /** The primary's offer, on a fresh peer connection. */
  async #offer(): Promise<void> {
    if (this.#done) return;
    const pc = this.#fresh(attemptName());
    const n = this.#n;
    await pc.setLocalDescription(await pc.createOffer());
    if (this.#pc !== pc) return;
    this.#send({ type: "offer", n, sdp: pc.localDescription!.sdp });
    this.#flushLocal();
  }

  async #handle(plaintext: Uint8Array): Promise<void> {
    if (this.#done) return;
    let m: Msg;
    try {
      m = JSON.parse(fromUtf8(plaintext)) as Msg;
    } catch {
      return; // not ours: the app may speak on the channel too
    }
    if (m === null || typeof m !== "object" || typeof m.n !== "string") return;
    const primary = this.#o.role === "primary";
    if (m.type === "offer" && !primary && typeof m.sdp === "string") {
      // Every offer starts an attempt: the primary sends one per attempt.
      const pc = this.#fresh(m.n);
      await pc.setRemoteDescription({ type: "offer", sdp: m.sdp });
      await this.#remoteReady(pc);
      await pc.setLocalDescription(await pc.createAnswer());
      if (this.#pc !== pc) return;
      this.#send({ type: "answer", n: m.n, sdp: pc.localDescription!.sdp });
      this.#flushLocal();
    } else if (m.type === "answer" && primary && m.n === this.#n && this.#pc && !this.#remoteSet && typeof m.sdp === "string") {
      const pc = this.#pc;
      await pc.setRemoteDescription({ type: "answer", sdp: m.sdp });
      await this.#remoteReady(pc);
    } else if (m.type === "candidate" && m.n === this.#n && this.#pc && m.candidate && typeof m.candidate === "object") {
      if (this.#remoteSet) await addCandidate(this.#pc, m.candidate);
      else this.#remoteHeld.push(m.candidate);
    }
  }

  /** The remote description of pc is set: add the candidates held for it. */
  async #remoteReady(pc: RTCPeerConnection): Promise<void> {
    if (this.#pc !== pc) return;
    this.#remoteSet = true;
    const held = this.#remoteHeld;
    this.#remoteHeld = [];
    for (const c of held) await addCandidate(pc, c);
  }

  #flushLocal(): void {
    this.#localSent = true;
    const held = this.#localHeld;
    this.#localHeld = [];
    for (const c of held) this.#send({ type: "candidate", n: this.#n, candidate: c });
  }

  #send(m: Msg): void {
    // The channel sends in call order; a failure means it closed, which
    // onclose reports.
    this.#signal.send(JSON.stringify(m)).catch(() => {});
  }

  #finish(pc: RTCPeerConnection, channel: RTCDataChannel): void {
    if (this.#done) return;
    this.#done = true;
    clearTimeout(this.#timer);
    this.#detach();
    pc.onicecandidate = null;
    this.#resolve({ pc, channel, signal: this.#signal });
  }

  #fail(e: Error): void {
    if (this.#done) return;
    this.#done = true;
    clearTimeout(this.#timer);
    this.#detach();
    this.#pc?.close();
    this.#signal.close();
    this.#reject(e);
  }

  #detach(): void {
    this.#signal.onmessage = null;
    this.#signal.onpeer = null;
    this.#signal.onclose = null;
  }
}

/** A random attempt name: 8 bytes, hex. */
function attemptName(): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function candidateInit(c: RTCIceCandidate): RTCIceCandidateInit {
  return { candidate: c.candidate, sdpMid: c.sdpMid, sdpMLineIndex: c.sdpMLineIndex, usernameFragment: c.usernameFragment };
}

/** Adds a remote candidate; one the browser cannot use (another network, a stale attempt) is skipped, as trickle ICE allows. */
async function addCandidate(pc: RTCPeerConnection, c: RTCIceCandidateInit): Promise<void> {
  try {
    await pc.addIceCandidate(c);
  } catch {
    // skipped
  }
}
