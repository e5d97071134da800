// The signal channel (spec/mailbox.md, Signal): a WebSocket per device on
// /v1/<app>/mailbox/<id>/signal/<role>, through which the relay forwards
// binary frames between the two sides untouched and says whether the other
// side is there ("peer 1" / "peer 0"). Frames are sealed end to end with
// the link's signal keys (signalseal.ts): the relay forwards what anyone
// holding the bearer sends, so a frame that does not open, or replays an
// older counter, is dropped here and counted.

import { SealError } from "./envelope.js";
import { SocketClosedError } from "./errors.js";
import { reads, writes, type Link, type Role } from "./link.js";
import { SignalOpener, SignalSealer } from "./signalseal.js";

/** Options of SignalChannel.open (and connect()). */
export interface SignalOptions {
  /** The mailbox listener's origin, e.g. "https://relay.example.com" (http/https; ws/wss also accepted). */
  relay: string;
  /** The app, which must have the `signal` option. */
  app: string;
  link: Link;
  /** This device's side: the primary opens /signal/primary, the companion /signal/companion. */
  role: Role;
  /** The WebSocket class to use (default globalThis.WebSocket). */
  WebSocket?: typeof WebSocket;
}

/** How often the channel sends text "ping" while open (the relay closes a socket silent for 75 s). */
export const SIGNAL_PING_MS = 20_000;

/** The relay's largest signal frame (a larger one closes the socket with 1009). */
export const SIGNAL_MAX_FRAME = 64 * 1024;

/** The WebSocket URL of path at relay (an http(s) or ws(s) origin). */
export function socketURL(relay: string, path: string): string {
  const u = new URL(path, relay);
  if (u.protocol === "http:") u.protocol = "ws:";
  else if (u.protocol === "https:") u.protocol = "wss:";
  else if (u.protocol !== "ws:" && u.protocol !== "wss:") throw new TypeError(`relay ${JSON.stringify(relay)}: want an http(s) or ws(s) origin`);
  return u.toString();
}

/**
 * One side of a link's signal channel. Open it with SignalChannel.open();
 * the handlers may be set at any time. Frames are delivered in the order
 * they arrived and sent in the order send() was called.
 */
export class SignalChannel {
  /** "peer 1" (true) or "peer 0" (false) from the relay: whether the other side is connected. */
  onpeer: ((present: boolean) => void) | null = null;
  /** A frame from the other side that opened: its plaintext. */
  onmessage: ((plaintext: Uint8Array) => void) | null = null;
  /** The socket closed (4000 "replaced" when this side opened again elsewhere, 1000 when the mailbox was erased). */
  onclose: ((code: number, reason: string) => void) | null = null;

  readonly #ws: WebSocket;
  readonly #sealer: SignalSealer;
  readonly #opener: SignalOpener;
  #peer = false;
  #dropped = 0;
  #closed = false;
  #ping: ReturnType<typeof setInterval> | undefined;
  // Opening and sending are asynchronous (WebCrypto); these chains keep
  // them in order, since the opener refuses a counter at or below the last
  // one it accepted and the sealer numbers frames in call order.
  #inbound: Promise<void> = Promise.resolve();
  #outbound: Promise<void> = Promise.resolve();

  private constructor(ws: WebSocket, o: SignalOptions) {
    this.#ws = ws;
    this.#sealer = new SignalSealer(o.link.signalKey(writes(o.role)));
    this.#opener = new SignalOpener(o.link.signalKey(reads(o.role)));
  }

  /**
   * Opens this device's side: GET /v1/<app>/mailbox/<id>/signal/<role>,
   * subprotocols `zerobyte.v1` and `zerobyte.bearer.<access token>`.
   * Resolves when the socket is open; rejects with SocketClosedError when
   * it closes first (a refused upgrade, 404 for an app without `signal` or
   * a mailbox that does not exist, 403, 429, surfaces so: browsers do not
   * show the status, the code is 1006).
   */
  static open(o: SignalOptions): Promise<SignalChannel> {
    const WS = o.WebSocket ?? globalThis.WebSocket;
    if (typeof WS !== "function") throw new TypeError("signal: no WebSocket (pass options.WebSocket)");
    if (o.role !== "primary" && o.role !== "companion") throw new TypeError(`signal: role ${JSON.stringify(o.role)}`);
    const url = socketURL(o.relay, `/v1/${encodeURIComponent(o.app)}/mailbox/${encodeURIComponent(o.link.id)}/signal/${o.role}`);
    const ws = new WS(url, ["zerobyte.v1", `zerobyte.bearer.${o.link.accessToken}`]);
    ws.binaryType = "arraybuffer";
    const ch = new SignalChannel(ws, o);
    return new Promise((resolve, reject) => {
      let opened = false;
      ws.onopen = () => {
        opened = true;
        ch.#ping = setInterval(() => ch.#sendPing(), SIGNAL_PING_MS);
        resolve(ch);
      };
      ws.onmessage = (e: MessageEvent) => ch.#receive(e.data);
      const ended = (code: number, reason: string) => {
        if (ch.#closed) return; // a browser's close after the error below
        ch.#closed = true;
        ch.#peer = false;
        clearInterval(ch.#ping);
        if (!opened) {
          reject(new SocketClosedError(code, reason, `signal: ${url} closed before it opened (${code}${reason ? " " + reason : ""}; a refused upgrade shows as 1006)`));
          return;
        }
        ch.onclose?.(code, reason);
      };
      // A failed upgrade: browsers fire error then close 1006; Node 20's
      // WebSocket fires only the error. Either way it ends here once.
      ws.onerror = () => {
        if (!opened) ended(1006, "");
      };
      ws.onclose = (e: CloseEvent) => ended(e.code, e.reason);
    });
  }

  /** Whether the other side is connected, as the relay last said. */
  get peerPresent(): boolean {
    return this.#peer;
  }

  /** How many frames were dropped: forged (bad tag), malformed, replayed or stale. */
  get dropped(): number {
    return this.#dropped;
  }

  /** Whether the socket has closed. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Seals message (a string is UTF-8 encoded) and sends it. The relay
   * drops a frame while the other side is not connected. Rejects with
   * SocketClosedError when the socket has closed, RangeError for a frame
   * above 64 KiB (which the relay would answer by closing the socket).
   */
  send(message: Uint8Array | string): Promise<void> {
    const next = this.#outbound.then(async () => {
      if (this.#closed) throw new SocketClosedError(1006, "", "signal: send on a closed channel");
      const frame = await this.#sealer.seal(message);
      if (frame.length > SIGNAL_MAX_FRAME) throw new RangeError(`signal: frame of ${frame.length} bytes, the relay forwards at most ${SIGNAL_MAX_FRAME}`);
      if (this.#closed) throw new SocketClosedError(1006, "", "signal: send on a closed channel");
      this.#ws.send(frame);
    });
    this.#outbound = next.catch(() => {});
    return next;
  }

  /** Closes the socket (1000). onclose still fires. */
  close(): void {
    clearInterval(this.#ping);
    this.#ws.close(1000);
  }

  #sendPing(): void {
    if (!this.#closed) this.#ws.send("ping");
  }

  #receive(data: unknown): void {
    if (typeof data === "string") {
      if (data === "peer 1" || data === "peer 0") {
        this.#peer = data === "peer 1";
        const present = this.#peer;
        // Through the inbound chain, so that a frame that arrived before
        // "peer 0" is delivered before it.
        this.#inbound = this.#inbound.then(() => this.onpeer?.(present)).catch(() => {});
      }
      return; // "pong"
    }
    const bytes = toBytes(data);
    this.#inbound = this.#inbound.then(async () => {
      const frame = await bytes;
      let plaintext: Uint8Array;
      try {
        plaintext = await this.#opener.open(frame);
      } catch (e) {
        if (!(e instanceof SealError)) throw e;
        this.#dropped++;
        return;
      }
      this.onmessage?.(plaintext);
    }).catch(() => {}); // a handler's exception must not stop the channel
  }
}

/** The bytes of a binary message (an ArrayBuffer, or a Blob when binaryType could not be set). */
async function toBytes(data: unknown): Promise<Uint8Array> {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (typeof Blob !== "undefined" && data instanceof Blob) return new Uint8Array(await data.arrayBuffer());
  return new Uint8Array(0); // not a frame: fails to open, counted as dropped
}
