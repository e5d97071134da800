// The watcher behind Mailbox.watch (spec/mailbox.md, section Watch): one
// WebSocket at a time on GET …/<dir>/watch?after=<floor>, reopened after
// every drop until the relay closes with 1000 (an erase) or close() is
// called. The relay stores what it sends, so a drop loses nothing: the next
// socket starts above the reader's floor and the reader drops what it had
// already accepted.
//
// Memory is bounded: frames wait for decryption in one ordered chain, and a
// socket whose waiting frames pass maxQueuedBytes is dropped and reopened
// (the relay does the same to a reader 1 MiB behind, with 1013).

import { SealError } from "./envelope.js";
import { ProtocolError, RelayError, SocketClosedError } from "./errors.js";
import type { Message, WatchHandlers, Watcher } from "./mailbox.js";

/** Timing of a watch; every field is optional. */
export interface WatchTiming {
  /** Text "ping" every this many ms while in the foreground (20,000: the relay's foreground mark lasts 45 s). */
  pingMs?: number;
  /** A ping with no "pong" within this many ms drops the socket (10,000). */
  pongTimeoutMs?: number;
  /** The first reconnect waits 50 to 100 % of this (500 ms), doubling with each failure in a row. */
  backoffMinMs?: number;
  /** The cap of the reconnect wait before jitter (30,000 ms). */
  backoffMaxMs?: number;
  /**
   * A socket still connecting after this many ms (10,000) is dropped and
   * tried again: a connection accepted by a listener that will never answer
   * (a relay draining, a dead proxy) would otherwise wait for ever.
   */
  openTimeoutMs?: number;
  /** An open socket that reported an error but no close within this many ms (2,000) is dropped. */
  errorGraceMs?: number;
  /** A socket that stayed open this long (10,000 ms), or delivered a message, resets the backoff. */
  stableMs?: number;
  /** Bytes of frames waiting to be opened beyond which the socket is dropped and reopened (1 MiB). */
  maxQueuedBytes?: number;
}

/** What the watcher needs of its Mailbox. */
export interface WatchDeps {
  /** The ws(s) URL of the watch endpoint, resuming above after. */
  url(after: number): string;
  /** The subprotocols to offer: zerobyte.v1 and the bearer. */
  protocols: string[];
  WebSocket: typeof WebSocket;
  /** Opens an envelope and records it (EnvelopeReader.accept). */
  accept(envelope: Uint8Array): Promise<Message>;
  /** The reader's floor, the `after` of the next socket. */
  floor(): number;
  /** Counts a dropped envelope. */
  dropped(): void;
  /** After a socket that did not open: the RelayError of a HEAD of the direction, undefined when it succeeded or got no answer. */
  probe(): Promise<RelayError | undefined>;
}

const DEFAULTS: Required<WatchTiming> = {
  pingMs: 20_000,
  pongTimeoutMs: 10_000,
  backoffMinMs: 500,
  backoffMaxMs: 30_000,
  stableMs: 10_000,
  openTimeoutMs: 10_000,
  errorGraceMs: 2_000,
  maxQueuedBytes: 1 << 20,
};

/** Our own close code for a socket we drop (no pong, too far behind): an application code, never sent by the relay. */
const DROP_CODE = 4000;

/** The Watcher of Mailbox.watch; see there. */
export class WatchLoop implements Watcher {
  readonly closed: Promise<void>;
  #resolveClosed!: () => void;
  #error: Error | undefined;
  readonly #d: WatchDeps;
  readonly #h: WatchHandlers;
  readonly #t: Required<WatchTiming>;
  #foreground: boolean;

  #ws: WebSocket | undefined;
  /** Bumped for each socket and when one is dropped: events of an older socket are ignored. */
  #gen = 0;
  #stopped = false;
  /** close() was called: deliver nothing more. */
  #userClosed = false;
  /** Failures in a row, for the backoff. */
  #attempt = 0;
  #reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  #pingTimer: ReturnType<typeof setInterval> | undefined;
  #pongTimer: ReturnType<typeof setTimeout> | undefined;
  #openTimer: ReturnType<typeof setTimeout> | undefined;
  /** Frames in order: each opened and delivered after the one before. */
  #chain: Promise<void> = Promise.resolve();
  #queuedBytes = 0;

  constructor(d: WatchDeps, h: WatchHandlers, foreground: boolean, timing: WatchTiming) {
    this.#d = d;
    this.#h = h;
    this.#foreground = foreground;
    this.#t = { ...DEFAULTS, ...stripUndefined(timing) };
    this.closed = new Promise((r) => (this.#resolveClosed = r));
    this.#connect();
  }

  get error(): Error | undefined {
    return this.#error;
  }

  get foreground(): boolean {
    return this.#foreground;
  }
  set foreground(on: boolean) {
    if (on === this.#foreground) return;
    this.#foreground = on;
    this.#stopPing();
    if (on && this.#ws?.readyState === 1) this.#startPing(this.#ws, this.#gen);
  }

  close(): void {
    if (this.#stopped) return;
    this.#userClosed = true;
    this.#finish(undefined);
  }

  #connect(): void {
    if (this.#stopped) return;
    const gen = ++this.#gen;
    let ws: WebSocket;
    try {
      ws = new this.#d.WebSocket(this.#d.url(this.#d.floor()), this.#d.protocols);
    } catch (e) {
      // A URL the WebSocket constructor refuses will not get better.
      this.#finish(e instanceof Error ? e : new Error(String(e)));
      return;
    }
    this.#ws = ws;
    ws.binaryType = "arraybuffer";
    let opened = false;
    let openedAt = 0;
    let delivered = false;
    clearTimeout(this.#openTimer);
    this.#openTimer = setTimeout(() => {
      this.#openTimer = undefined;
      if (gen !== this.#gen || opened) return;
      this.#drop(ws);
      this.#report(new SocketClosedError(DROP_CODE, "open timeout", `watch: socket not open after ${this.#t.openTimeoutMs} ms; trying again`));
      this.#reconnect(true);
    }, this.#t.openTimeoutMs);
    ws.onopen = () => {
      if (gen !== this.#gen) return;
      clearTimeout(this.#openTimer);
      this.#openTimer = undefined;
      if (ws.protocol !== this.#d.protocols[0]) {
        // Not quoted: a relay that echoes the bearer would put it in the message.
        this.#drop(ws);
        this.#finish(new ProtocolError("bad_socket", `watch: the relay answered a subprotocol other than ${this.#d.protocols[0]}`));
        return;
      }
      opened = true;
      openedAt = Date.now();
      if (this.#foreground) this.#startPing(ws, gen);
      this.#call(() => this.#h.onOpen?.());
    };
    ws.onmessage = (ev: MessageEvent) => {
      if (gen !== this.#gen) return;
      const data: unknown = ev.data;
      if (typeof data === "string") {
        if (data === "pong") {
          clearTimeout(this.#pongTimer);
          this.#pongTimer = undefined;
          return;
        }
        this.#report(new ProtocolError("bad_socket", `watch: unexpected text frame ${JSON.stringify(data.slice(0, 32))} from the relay`));
        this.#drop(ws);
        this.#reconnect(false);
        return;
      }
      const env = data instanceof ArrayBuffer ? new Uint8Array(data) : ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : undefined;
      if (!env) {
        this.#report(new ProtocolError("bad_socket", `watch: a binary frame arrived as ${Object.prototype.toString.call(data)}, not an ArrayBuffer`));
        this.#drop(ws);
        this.#reconnect(false);
        return;
      }
      if (this.#queuedBytes + env.length > this.#t.maxQueuedBytes) {
        // Reading faster than we open: leave the rest with the relay.
        this.#drop(ws);
        this.#report(new SocketClosedError(DROP_CODE, "behind", `watch: over ${this.#t.maxQueuedBytes} bytes wait to be opened; reopening above ${this.#d.floor()}`));
        this.#reconnect(false);
        return;
      }
      this.#queuedBytes += env.length;
      this.#chain = this.#chain.then(async () => {
        try {
          if (this.#userClosed) return;
          let m: Message;
          try {
            m = await this.#d.accept(env);
          } catch (e) {
            if (!(e instanceof SealError)) throw e;
            this.#d.dropped();
            // Replays are normal after a reconnect; anything else is news.
            if (e.code !== "replay") this.#report(e);
            return;
          }
          delivered = true;
          if (!this.#userClosed) this.#call(() => this.#h.onMessage(m));
        } finally {
          this.#queuedBytes -= env.length;
        }
      }).catch((e: unknown) => this.#report(e instanceof Error ? e : new Error(String(e))));
    };
    ws.onerror = () => {
      if (gen !== this.#gen) return;
      if (!opened) {
        // Browsers follow with a close event (1006), but Node's WebSocket
        // (undici, Node 20) stays CONNECTING after a refused connection and
        // never closes: take the error as the failed open.
        this.#drop(ws);
        this.#report(new SocketClosedError(1006, "", `watch: socket did not open (connection failed); reconnecting above ${this.#d.floor()}`));
        this.#reconnect(true);
        return;
      }
      // Open: the close event that follows says what happened; should it
      // not come, the socket is dropped after a grace period.
      setTimeout(() => {
        if (gen !== this.#gen) return;
        this.#drop(ws);
        this.#report(new SocketClosedError(1006, "", `watch: socket failed; reconnecting above ${this.#d.floor()}`));
        this.#reconnect(false);
      }, this.#t.errorGraceMs);
    };
    ws.onclose = (ev: CloseEvent) => {
      if (gen !== this.#gen) return;
      clearTimeout(this.#openTimer);
      this.#openTimer = undefined;
      this.#stopPing();
      // Done with this socket: its timers (the error grace) must not act.
      this.#gen++;
      this.#ws = undefined;
      if (this.#stopped) return;
      if (ev.code === 1000) {
        this.#finish(new SocketClosedError(1000, ev.reason, `watch: the relay closed the watch with 1000${ev.reason ? " " + ev.reason : ""} (the mailbox was erased)`));
        return;
      }
      if (opened && (delivered || Date.now() - openedAt >= this.#t.stableMs)) this.#attempt = 0;
      this.#report(new SocketClosedError(ev.code, ev.reason, `watch: socket ${opened ? "closed" : "did not open"} (${ev.code}${ev.reason ? " " + ev.reason : ""}); reconnecting above ${this.#d.floor()}`));
      this.#reconnect(!opened);
    };
  }

  /** Abandons ws: its later events are ignored, and it is closed (with our own code) if it is still open. */
  #drop(ws: WebSocket): void {
    if (ws === this.#ws) {
      this.#gen++;
      this.#ws = undefined;
    }
    this.#stopPing();
    try {
      ws.close(DROP_CODE);
    } catch {
      // Closing an already closing socket may throw in some implementations.
    }
  }

  /**
   * Opens the next socket after the backoff, once every frame received so
   * far has been opened (so that its `after` is the floor they reach). A
   * socket that never opened is first explained by a HEAD: 401, 403 and 404
   * stop the watch; 429 waits out its Retry-After.
   */
  #reconnect(neverOpened: boolean): void {
    if (this.#stopped) return;
    const cap = Math.min(this.#t.backoffMaxMs, this.#t.backoffMinMs * 2 ** Math.min(this.#attempt, 30));
    let delay = cap * (0.5 + Math.random() * 0.5);
    this.#attempt++;
    const gen = this.#gen;
    void (async () => {
      if (neverOpened) {
        const err = await this.#d.probe();
        if (this.#stopped || gen !== this.#gen) return;
        if (err && (err.status === 401 || err.status === 403 || err.status === 404)) {
          this.#finish(err);
          return;
        }
        if (err?.retryAfter !== undefined) delay = Math.max(delay, err.retryAfter * 1000);
      }
      await this.#chain;
      if (this.#stopped || gen !== this.#gen) return;
      this.#reconnectTimer = setTimeout(() => {
        this.#reconnectTimer = undefined;
        if (gen === this.#gen) this.#connect();
      }, delay);
    })();
  }

  #startPing(ws: WebSocket, gen: number): void {
    const ping = () => {
      if (gen !== this.#gen || this.#pongTimer !== undefined) return;
      try {
        ws.send("ping");
      } catch {
        return; // closing: the close event reconnects
      }
      this.#pongTimer = setTimeout(() => {
        this.#pongTimer = undefined;
        if (gen !== this.#gen) return;
        this.#drop(ws);
        this.#report(new SocketClosedError(DROP_CODE, "no pong", `watch: no pong within ${this.#t.pongTimeoutMs} ms; reconnecting above ${this.#d.floor()}`));
        this.#reconnect(false);
      }, this.#t.pongTimeoutMs);
    };
    // At once, so that the relay marks this reader as in the foreground
    // from the start (no push while it watches), then every pingMs.
    ping();
    this.#pingTimer = setInterval(ping, this.#t.pingMs);
  }

  #stopPing(): void {
    clearInterval(this.#pingTimer);
    clearTimeout(this.#pongTimer);
    this.#pingTimer = undefined;
    this.#pongTimer = undefined;
  }

  /** Stops for good: err (undefined for close()) goes to onError, then closed resolves once the frames received are handled. */
  #finish(err: Error | undefined): void {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#error = err;
    clearTimeout(this.#reconnectTimer);
    clearTimeout(this.#openTimer);
    this.#stopPing();
    const ws = this.#ws;
    this.#gen++;
    this.#ws = undefined;
    if (ws && ws.readyState <= 1) {
      try {
        ws.close(1000);
      } catch {
        // already closing
      }
    }
    if (err) this.#report(err);
    void this.#chain.then(() => this.#resolveClosed());
  }

  #report(e: Error): void {
    try {
      this.#h.onError?.(e);
    } catch {
      // An onError that throws has nowhere left to report to.
    }
  }

  /** Runs a handler; what it throws goes to onError. */
  #call(f: () => void): void {
    try {
      f();
    } catch (e) {
      this.#report(e instanceof Error ? e : new Error(String(e)));
    }
  }
}

function stripUndefined(t: WatchTiming): WatchTiming {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(t)) if (v !== undefined) out[k] = v;
  return out as WatchTiming;
}
