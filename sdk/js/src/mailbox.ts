// The mailbox client (spec/mailbox.md: Core endpoints, Watch, Push): one
// device's handle on its link's mailbox. Raw calls, one per endpoint, move
// envelopes as opaque bytes like the Go SDK's sdk/mailbox; send(), receive()
// and watch() seal and open them with the link's keys.

import { BATCH_CONTENT_TYPE, decodeBatch } from "./batch.js";
import { ENVELOPE_OVERHEAD, EnvelopeReader, SealError, checkSequence, envelopeSequence, sealEnvelope } from "./envelope.js";
import { NetworkError, ProtocolError, RelayError, relayErrorOf } from "./errors.js";
import { reads, writes, type Direction, type Link, type Role } from "./link.js";
import { utf8 } from "./bytes.js";
import { WatchLoop, type WatchTiming } from "./watch.js";

/** What a writer may ask of the relay with an envelope: a visible push, or a background wake-up. */
export type Notify = "alert" | "silent";

/** A message opened from the mailbox. */
export interface Message {
  /** The envelope's sequence in its direction. */
  seq: number;
  /** The plaintext, as sent (a string was sent as UTF-8). */
  plaintext: Uint8Array;
}

/** The handlers of watch(). */
export interface WatchHandlers {
  /** Each new message, once, in the order the relay stored them (ascending sequences). An exception thrown here goes to onError; the watch goes on. */
  onMessage(m: Message): void;
  /** Each time a socket opens (the first time and after every reconnect). */
  onOpen?(): void;
  /**
   * What went wrong. Transient: a dropped socket (SocketClosedError; the
   * watcher reconnects), a forged or malformed envelope (SealError; dropped),
   * an exception of onMessage. Final, after which `closed` resolves: the
   * relay closed with 1000 (SocketClosedError 1000: the mailbox was erased),
   * the relay refused the watch (RelayError 401/403/404, found by a HEAD after
   * a socket that did not open), a relay that does not speak zerobyte.v1
   * (ProtocolError). Watcher.error holds the final one.
   */
  onError?(e: Error): void;
}

/** A running watch (Mailbox.watch). */
export interface Watcher {
  /** Stops: closes the socket (1000) and reconnects no more; no onMessage after it. */
  close(): void;
  /** Resolves once the watcher has stopped, by close() or for good (see WatchHandlers.onError), and every message received before was handled. */
  readonly closed: Promise<void>;
  /** Why it stopped on its own (undefined while running and after close()). */
  readonly error: Error | undefined;
  /**
   * Whether it pings (text "ping" every 20 s): a reader in the foreground gets
   * no push while it watches. Set false when the app goes to the background,
   * so that the relay pushes again 45 s after the last ping.
   */
  foreground: boolean;
}

/** A sealed envelope whose PUT has not succeeded yet: see Mailbox.pending. */
export interface PendingEnvelope {
  seq: number;
  envelope: Uint8Array;
  notify?: Notify;
}

/**
 * Whether a PUT's failure can never turn into success for those bytes: any
 * 4xx but 429 (409 conflict: the number is taken or pruned past; 413; 400;
 * 401/403/404: no such mailbox for this token). 429, 5xx (507 full, 503
 * storage unavailable) and no answer at all may pass on a later try.
 */
function permanent(e: unknown): boolean {
  return e instanceof RelayError && e.status >= 400 && e.status < 500 && e.status !== 429;
}

/** How many sealed envelopes a Mailbox keeps pending before send() refuses to seal more. */
export const MAX_PENDING = 16;

/** Options of a Mailbox. */
export interface MailboxOptions {
  /** The mailbox listener's origin, e.g. "https://relay.example.com" (a path prefix is kept). */
  relay: string;
  /** The app name: the first path segment after /v1/ (1 to 32 of a-z 0-9 -). */
  app: string;
  /** The link; its id is the mailbox id and its access token the bearer. */
  link: Link;
  /** This device's role: the primary writes p2c and reads c2p, the companion the other way round. */
  role: Role;
  /** fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch;
  /** WebSocket to use for watch() (default globalThis.WebSocket; Node 20 needs --experimental-websocket). */
  WebSocket?: typeof WebSocket;
  /**
   * Default true: a request answered 429 rate_limited (for a HEAD, which has
   * no body, code http_429) with a Retry-After of
   * at most 5 s is sent once more after that wait (every request of this
   * client is safe to repeat: an envelope PUT repeated answers 200 "same").
   * A longer wait, a second 429 or too_many_watchers reject with RelayError
   * (retryAfter set) at once; false turns the retry off.
   */
  retryRateLimited?: boolean;
  /**
   * The relay's RELAY_MAX_ENVELOPE (default 65,536 bytes). send() refuses
   * (RangeError, no sequence used) a message whose envelope would be larger,
   * rather than spend a sequence on a 413.
   */
  maxEnvelope?: number;
  /** Timing of watch(): ping interval, backoff. The defaults are the protocol's; tests shorten them. */
  watchTiming?: WatchTiming;
}

/** Subprotocols of a watch socket: the protocol, then the bearer (browsers cannot set Authorization on a WebSocket). */
export const WATCH_SUBPROTOCOL = "zerobyte.v1";
/** Prefix of the bearer subprotocol. */
export const BEARER_SUBPROTOCOL = "zerobyte.bearer.";

/** The longest Retry-After that retryRateLimited waits out. */
const MAX_AUTO_RETRY_S = 5;
/** What a success answer may hold: a batch is at most 4 MiB but always has one envelope, whose limit is configurable. */
const MAX_BODY = 64 << 20;
/** The relay's batch limit bounds. */
const MAX_BATCH_LIMIT = 1000;

const APP_PATTERN = /^[a-z0-9-]{1,32}$/;

function checkDir(dir: Direction, op: string): void {
  if (dir !== "p2c" && dir !== "c2p") throw new TypeError(`mailbox: ${op}: invalid direction ${JSON.stringify(dir)} (want "p2c" or "c2p")`);
}

/** Throws RangeError unless v is an integer 0..2^53-1 (after, through). */
function checkMark(v: number, what: string): void {
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`mailbox: ${what} ${String(v)} is not an integer from 0 to ${Number.MAX_SAFE_INTEGER}`);
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * One device's handle on its link's mailbox. It makes no request until a
 * method is called.
 *
 * **Sequences.** The writer numbers its envelopes 1, 2, 3 … and must never
 * seal two messages under one number (the AES-GCM nonce is the number).
 * `nextSeq` is that counter: persist it after every send() and set it when
 * the app starts. When it was never set, the first send() asks the relay
 * (HEAD of the direction written) and uses the last stored sequence + 1; that
 * is right only while the reader has not pruned everything: a direction
 * emptied by a prune answers last = 0, and the relay refuses every sequence
 * at or below its pruned mark with 409 conflict. send() then rejects with
 * that RelayError (the message says to persist nextSeq) rather than guess a
 * number: a guess too high leaves a gap the reader cannot tell from a lost
 * envelope. Each send() spends its sequence before it sends anything, so a
 * number is never sealed twice; when its PUT fails (429, 507, 5xx, no
 * answer) the sealed envelope stays `pending` and is stored, those very
 * bytes, before the next message (or by flush()): the reader gets every
 * number in order, and a rejected send() must not be repeated. Persist
 * `pending` with nextSeq.
 *
 * **Reading.** receive() and watch() open envelopes with one EnvelopeReader
 * (replays and forgeries are dropped and counted in `dropped`) and deliver
 * each message once. Persist `readerFloor` and set it when the app starts;
 * prune(reads, readerFloor) lets the relay forget what was delivered.
 *
 * After erase(), make a new link: numbering from 1 again under the same key
 * would reuse nonces.
 */
export class Mailbox {
  /** The mailbox id: the link id. */
  readonly id: string;
  /** The direction this device writes. */
  readonly writes: Direction;
  /** The direction this device reads. */
  readonly reads: Direction;

  readonly #o: MailboxOptions;
  readonly #base: string;
  readonly #fetch: typeof fetch;
  #nextSeq = 0;
  #reader: EnvelopeReader;
  #dropped = 0;
  #sendQueue: Promise<unknown> = Promise.resolve();
  /** Sealed envelopes not stored yet, ascending: see pending. */
  #pending: PendingEnvelope[] = [];
  #watcher: WatchLoop | undefined;

  /** Throws TypeError for a relay that is not an http(s) URL, a bad app name or role. */
  constructor(o: MailboxOptions) {
    let u: URL;
    try {
      u = new URL(o.relay);
    } catch {
      throw new TypeError(`mailbox: relay ${JSON.stringify(o.relay)} is not a URL`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") throw new TypeError(`mailbox: relay ${JSON.stringify(o.relay)}: want an http(s) origin`);
    if (typeof o.app !== "string" || !APP_PATTERN.test(o.app)) throw new TypeError(`mailbox: app ${JSON.stringify(o.app)} is not 1 to 32 of a-z 0-9 -`);
    if (o.maxEnvelope !== undefined && (!Number.isSafeInteger(o.maxEnvelope) || o.maxEnvelope < ENVELOPE_OVERHEAD)) {
      throw new RangeError(`mailbox: maxEnvelope ${String(o.maxEnvelope)} is not an integer of at least ${ENVELOPE_OVERHEAD}`);
    }
    this.#o = o;
    this.writes = writes(o.role);
    this.reads = reads(o.role);
    this.id = o.link.id;
    this.#base = `${o.relay.replace(/\/+$/, "")}/v1/${o.app}/mailbox/${encodeURIComponent(o.link.id)}`;
    // Called as a plain function: a browser's fetch throws "Illegal
    // invocation" when called as a method of another object.
    this.#fetch = o.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.#reader = new EnvelopeReader(o.link.envelopeKey(this.reads));
  }

  /**
   * The sequence the next send() uses; 0 while unknown (send() then asks
   * HEAD). Persist it after each send(). Setting it throws RangeError unless
   * it is an integer 0..2^53-1 (0: ask HEAD again).
   */
  get nextSeq(): number {
    return this.#nextSeq;
  }
  set nextSeq(v: number) {
    checkMark(v, "nextSeq");
    this.#nextSeq = v;
  }

  /**
   * The reader's floor: every sequence at or below it has been delivered (or
   * given up). Persist it; set it when the app starts, before receive() or
   * watch(). Setting it starts a new EnvelopeReader (forgetting the sequences
   * above the floor it had accepted) and throws Error while a watch runs,
   * RangeError unless it is an integer 0..2^53-1.
   */
  get readerFloor(): number {
    return this.#reader.floor;
  }
  set readerFloor(v: number) {
    checkMark(v, "readerFloor");
    if (this.#watcher) throw new Error("mailbox: readerFloor cannot change while a watch runs");
    this.#reader = new EnvelopeReader(this.#o.link.envelopeKey(this.reads), v);
  }

  /** How many envelopes receive() and watch() dropped: replays (normal after a reconnect), forgeries, malformed ones. */
  get dropped(): number {
    return this.#dropped;
  }

  /**
   * Claims the mailbox for the link's token: "created" (201) when the relay
   * made it, "owned" (204) when it was already this token's. Rejects with
   * RelayError 409 `taken` when another token holds the id.
   */
  async claim(): Promise<"created" | "owned"> {
    const resp = await this.#request("claim", "PUT", "", { ok: [201, 204] });
    return resp.status === 201 ? "created" : "owned";
  }

  /**
   * The claim as a heartbeat: restarts the relay's idle timer (RELAY_IDLE,
   * 30 days by default), after which a mailbox with no claim and no write is
   * erased. Call it about once a week when the link may stay quiet.
   */
  async heartbeat(): Promise<void> {
    await this.claim();
  }

  /** Erases the mailbox: both directions, push registrations and marks. Watchers stop (1000). Use a new link afterwards. */
  async erase(): Promise<void> {
    await this.#request("erase", "DELETE", "", { ok: [204] });
  }

  /**
   * Seals message (a string is UTF-8 encoded) with the next sequence and
   * stores it in this device's direction; resolves with the sequence used.
   * notify asks the relay to push the reader. Calls are carried out one
   * after another, in call order. See the class comment on sequences.
   * Envelopes of earlier sends still pending go first (see pending).
   * Rejects with RangeError, the message not sealed, when the envelope would
   * exceed maxEnvelope or MAX_PENDING envelopes are pending; with
   * RelayError for the relay's refusals (507 mailbox_full, 429 rate_limited
   * ...) or NetworkError when the relay did not answer, the message then
   * pending (stored by the next send() or flush(): do not send it again);
   * with RelayError 409 conflict, 413 or another 4xx when its envelope can
   * never be stored (then nothing stays pending).
   */
  send(message: Uint8Array | string, opts: { notify?: Notify } = {}): Promise<number> {
    return this.#queued(() => this.#sendOne(message, opts.notify));
  }

  /**
   * The sealed envelopes of send() calls that rejected with a RelayError or
   * a NetworkError, ascending by sequence (at most MAX_PENDING). Their
   * numbers are spent, so they must reach the relay or the reader sees a
   * hole: each later send() and flush() stores them first, byte for byte,
   * which is safe to repeat (the relay answers 200 "same" to a PUT that did
   * land the first time) and seals nothing twice. So a message whose send()
   * rejected that way is not lost: do not send it again (it would arrive
   * twice). Persist this list with nextSeq and set it when the app starts;
   * setting checks each envelope carries its seq, ascending (TypeError).
   * An envelope the relay refuses for good (any 4xx but 429: 409 conflict,
   * its number taken by other bytes or pruned past; 413; 404 ...) can never
   * be stored and is dropped; its number stays a hole.
   */
  get pending(): PendingEnvelope[] {
    return this.#pending.map((p) => ({ ...p }));
  }
  set pending(list: PendingEnvelope[]) {
    let last = 0;
    for (const p of list) {
      checkNotify(p.notify, "pending");
      if (!(p.envelope instanceof Uint8Array) || p.seq <= last || envelopeSequence(p.envelope) !== p.seq) {
        throw new TypeError(`mailbox: pending: envelope ${String(p.seq)} does not carry its sequence, or the list is not ascending`);
      }
      last = p.seq;
    }
    if (list.length > MAX_PENDING) throw new RangeError(`mailbox: pending: ${list.length} envelopes, at most ${MAX_PENDING}`);
    this.#pending = list.map((p) => ({ ...p }));
  }

  /**
   * Stores the pending envelopes (see pending) now, in turn with send();
   * resolves with how many were stored. Rejects as send() does, and what
   * is left stays pending.
   */
  flush(): Promise<number> {
    return this.#queued(() => this.#flushPending());
  }

  #queued<T>(op: () => Promise<T>): Promise<T> {
    const p = this.#sendQueue.then(op);
    this.#sendQueue = p.catch(() => {});
    return p;
  }

  /** Stores the pending envelopes in order; the first failure stops it (a conflict drops that one and goes on). */
  async #flushPending(): Promise<number> {
    let stored = 0;
    while (this.#pending.length > 0) {
      const p = this.#pending[0]!;
      try {
        await this.put(this.writes, p.seq, p.envelope, p.notify);
        stored++;
      } catch (e) {
        if (!permanent(e)) throw e;
        if (this.#pending[0] === p) this.#pending.shift();
        if (this.#pending.length === 0) throw e;
        continue;
      }
      if (this.#pending[0] === p) this.#pending.shift();
    }
    return stored;
  }

  async #sendOne(message: Uint8Array | string, notify: Notify | undefined): Promise<number> {
    const bytes = typeof message === "string" ? utf8(message) : message;
    if (!(bytes instanceof Uint8Array)) throw new TypeError(`mailbox: send: message must be a Uint8Array or a string, got ${typeof message}`);
    const max = this.#o.maxEnvelope ?? 65536;
    if (bytes.length + ENVELOPE_OVERHEAD > max) {
      throw new RangeError(`mailbox: send: a ${bytes.length}-byte message makes a ${bytes.length + ENVELOPE_OVERHEAD}-byte envelope, over maxEnvelope ${max}`);
    }
    checkNotify(notify, "send");
    if (this.#pending.length >= MAX_PENDING) {
      throw new RangeError(`mailbox: send: ${this.#pending.length} earlier envelopes are not stored yet (pending): flush() them first; this message was not sealed`);
    }
    let fromHead = false;
    if (this.#nextSeq === 0) {
      const h = await this.head(this.writes);
      this.#nextSeq = h.last + 1;
      fromHead = true;
    }
    const seq = this.#nextSeq;
    checkSequence(seq, "mailbox: send: sequence");
    // Spent before anything leaves: whatever happens next, seq is never
    // sealed again.
    this.#nextSeq = seq + 1;
    const env = await sealEnvelope(this.#o.link.envelopeKey(this.writes), seq, bytes);
    // Queued behind the envelopes of earlier failed sends, so that the
    // reader gets every number, in order; it stays queued if its PUT fails.
    this.#pending.push({ seq, envelope: env, notify });
    try {
      await this.#flushPending();
    } catch (e) {
      if (fromHead && e instanceof RelayError && e.code === "conflict") {
        throw new RelayError(e.status, e.code, {
          retryAfter: e.retryAfter,
          op: `mailbox: send ${this.writes}/${seq} (numbered from HEAD, the relay holds nothing above it but has pruned past it: persist nextSeq and set it)`,
        });
      }
      throw e;
    }
    return seq;
  }

  /**
   * Fetches what the relay holds above the reader's floor and opens it:
   * at most limit messages (default 100, at most 1,000), in ascending order,
   * paging while the relay says more remain. Replays and forgeries are
   * dropped (counted in `dropped`). The floor advances over what is returned.
   */
  async receive(opts: { limit?: number } = {}): Promise<Message[]> {
    const limit = opts.limit ?? 100;
    checkLimit(limit, "receive");
    const out: Message[] = [];
    let after = this.#reader.floor;
    for (;;) {
      const { envelopes, more } = await this.batch(this.reads, { after, limit: limit - out.length });
      const before = after;
      for (const env of envelopes) {
        try {
          after = Math.max(after, envelopeSequence(env));
          out.push(await this.#reader.accept(env));
        } catch (e) {
          if (!(e instanceof SealError)) throw e;
          this.#dropped++;
        }
      }
      // after did not move: nothing in the page parsed, and asking again would get the same page.
      if (!more || out.length >= limit || after === before) return out;
    }
  }

  /**
   * Watches the direction this device reads: first every stored envelope
   * above the reader's floor, then each new one as it is stored, each
   * delivered once to h.onMessage, in order. A dropped socket (1006, 1013,
   * 1001, a missing pong ...) reconnects after a capped exponential backoff
   * with jitter, resuming above the floor; a relay that closes with 1000 (an
   * erase) or close() stops it. A socket refused before it opened (a browser
   * does not show the status) is followed by a HEAD: 401/403/404 stop the
   * watch with that RelayError, 429 waits out its Retry-After. With
   * opts.foreground (default true) it sends text "ping" every 20 s and
   * reconnects when no "pong" comes back. One watch per Mailbox at a time
   * (Error otherwise).
   */
  watch(h: WatchHandlers, opts: { foreground?: boolean } = {}): Watcher {
    if (this.#watcher) throw new Error("mailbox: a watch already runs on this Mailbox (close it first)");
    const WS = this.#o.WebSocket ?? globalThis.WebSocket;
    if (typeof WS !== "function") throw new TypeError("mailbox: no WebSocket (pass options.WebSocket; Node 20 needs --experimental-websocket)");
    const base = this.#base.replace(/^http/, "ws");
    const w = new WatchLoop(
      {
        url: (after) => `${base}/${this.reads}/watch?after=${after}`,
        protocols: [WATCH_SUBPROTOCOL, BEARER_SUBPROTOCOL + this.#o.link.accessToken],
        WebSocket: WS,
        accept: (env) => this.#reader.accept(env),
        floor: () => this.#reader.floor,
        dropped: () => void this.#dropped++,
        probe: async () => {
          try {
            // No retry of its own: the watcher waits out a 429 itself.
            await this.#head(this.reads, false);
            return undefined;
          } catch (e) {
            return e instanceof RelayError ? e : undefined;
          }
        },
      },
      h,
      opts.foreground ?? true,
      this.#o.watchTiming ?? {},
    );
    this.#watcher = w;
    void w.closed.then(() => {
      if (this.#watcher === w) this.#watcher = undefined;
    });
    return w;
  }

  // Raw: one call per endpoint of spec/mailbox.md. Envelopes are sent as
  // given (the relay checks them).

  /**
   * PUT …/<dir>/<seq>: stores envelope. "created" (201: stored and synced),
   * "same" (200: these bytes were already stored under seq; a retry, pushed
   * no second time). RelayError 409 conflict (other bytes, or at or below the
   * pruned mark), 413 too_large, 507 mailbox_full, 400 bad_request (an
   * envelope whose header does not match seq). RangeError for a seq outside
   * 1..2^53-1, TypeError for a notify other than "alert" or "silent".
   */
  async put(dir: Direction, seq: number, envelope: Uint8Array, notify?: Notify): Promise<"created" | "same"> {
    checkDir(dir, "put");
    checkSequence(seq, "mailbox: put: sequence");
    checkNotify(notify, "put");
    if (!(envelope instanceof Uint8Array)) throw new TypeError(`mailbox: put: envelope must be a Uint8Array, got ${typeof envelope}`);
    const headers: Record<string, string> = { "Content-Type": "application/octet-stream" };
    if (notify !== undefined) headers["X-Relay-Notify"] = notify;
    const resp = await this.#request(`put ${dir}/${seq}`, "PUT", `/${dir}/${seq}`, { ok: [200, 201], body: envelope, headers });
    return resp.status === 201 ? "created" : "same";
  }

  /** GET …/<dir>/<seq>: the stored envelope's bytes; RelayError 404 when not stored. */
  async get(dir: Direction, seq: number): Promise<Uint8Array> {
    checkDir(dir, "get");
    checkSequence(seq, "mailbox: get: sequence");
    const op = `get ${dir}/${seq}`;
    const resp = await this.#request(op, "GET", `/${dir}/${seq}`, { ok: [200] });
    return readBody(resp, op);
  }

  /**
   * GET …/<dir>?after=&limit=: the stored envelopes above after (default
   * 0), ascending, at most limit (default: the relay's 100; 1 to 1,000) and
   * 4 MiB. more: the relay holds more; ask again with after = the last
   * envelope's sequence. ProtocolError for an answer that is not a batch.
   */
  async batch(dir: Direction, opts: { after?: number; limit?: number } = {}): Promise<{ envelopes: Uint8Array[]; more: boolean }> {
    checkDir(dir, "batch");
    const after = opts.after ?? 0;
    checkMark(after, "batch: after");
    let query = `?after=${after}`;
    if (opts.limit !== undefined) {
      checkLimit(opts.limit, "batch");
      query += `&limit=${opts.limit}`;
    }
    const op = `batch ${dir} after ${after}`;
    const resp = await this.#request(op, "GET", `/${dir}${query}`, { ok: [200] });
    const ct = resp.headers.get("Content-Type");
    if (ct !== BATCH_CONTENT_TYPE) {
      await resp.body?.cancel();
      throw new ProtocolError("bad_content_type", `mailbox: ${op}: Content-Type ${JSON.stringify(ct)}, want ${BATCH_CONTENT_TYPE}`);
    }
    const m = resp.headers.get("X-Relay-More");
    if (m !== "0" && m !== "1") {
      await resp.body?.cancel();
      throw new ProtocolError("bad_header", `mailbox: ${op}: X-Relay-More ${JSON.stringify(m)}, want 0 or 1`);
    }
    const body = await readBody(resp, op);
    let envelopes: Uint8Array[];
    try {
      envelopes = decodeBatch(body);
    } catch (e) {
      throw new ProtocolError("malformed_batch", `mailbox: ${op}: ${(e as Error).message}`);
    }
    return { envelopes, more: m === "1" };
  }

  /** HEAD …/<dir>: the first and last stored sequences (0 when none) and how many are stored. */
  async head(dir: Direction): Promise<{ first: number; last: number; count: number }> {
    return this.#head(dir, true);
  }

  async #head(dir: Direction, retry: boolean): Promise<{ first: number; last: number; count: number }> {
    checkDir(dir, "head");
    const op = `head ${dir}`;
    const resp = await this.#request(op, "HEAD", `/${dir}`, { ok: [200], noRetry: !retry });
    const num = (name: string): number => {
      const v = resp.headers.get(name);
      if (v === null || !/^\d{1,16}$/.test(v) || !Number.isSafeInteger(Number(v))) {
        throw new ProtocolError("bad_header", `mailbox: ${op}: ${name} ${JSON.stringify(v)} is not a decimal number up to 2^53-1`);
      }
      return Number(v);
    };
    return { first: num("X-Relay-First"), last: num("X-Relay-Last"), count: num("X-Relay-Count") };
  }

  /**
   * HEAD …/<dir>/<seq>: whether the envelope is stored. A mailbox that does
   * not exist also answers 404 (a HEAD has no body to tell them apart): false.
   */
  async has(dir: Direction, seq: number): Promise<boolean> {
    checkDir(dir, "has");
    checkSequence(seq, "mailbox: has: sequence");
    const resp = await this.#request(`has ${dir}/${seq}`, "HEAD", `/${dir}/${seq}`, { ok: [200, 404] });
    return resp.status === 200;
  }

  /**
   * DELETE …/<dir>?through=: deletes every envelope at or below through; the
   * relay keeps through as the pruned mark (a later PUT at or below it
   * answers 409 conflict). The reader prunes through its readerFloor.
   */
  async prune(dir: Direction, through: number): Promise<void> {
    checkDir(dir, "prune");
    checkMark(through, "prune: through");
    await this.#request(`prune ${dir} through ${through}`, "DELETE", `/${dir}?through=${through}`, { ok: [204] });
  }

  /**
   * PUT …/<reads>/push: registers this device for a push when the other
   * device writes with notify (an app with `push=`; else RelayError 404).
   * The relay checks the fields (RelayError 400): service "apns" or "fcm"
   * (or another module's name), token, environment (APNs: "production" or
   * "development"), tag (1 to 64 of A-Z a-z 0-9 _ -), alert (at most 160).
   */
  async registerPush(reg: { service: string; token: string; environment?: string; tag: string; alert?: string }): Promise<void> {
    const body: Record<string, string> = { service: reg.service, token: reg.token, tag: reg.tag };
    if (reg.environment !== undefined) body.environment = reg.environment;
    if (reg.alert !== undefined) body.alert = reg.alert;
    await this.#request(`register push on ${this.reads}`, "PUT", `/${this.reads}/push`, {
      ok: [204],
      body: utf8(JSON.stringify(body)),
      headers: { "Content-Type": "application/json" },
    });
  }

  /** DELETE …/<reads>/push: removes this device's push registration. */
  async unregisterPush(): Promise<void> {
    await this.#request(`unregister push on ${this.reads}`, "DELETE", `/${this.reads}/push`, { ok: [204] });
  }

  /**
   * One request with the bearer; resolves with the answer when its status is
   * one of ok (the body unread), else rejects with its RelayError, after the
   * one retry of a short 429 rate_limited (retryRateLimited).
   */
  async #request(op: string, method: string, path: string, r: { ok: number[]; body?: Uint8Array; headers?: Record<string, string>; noRetry?: boolean }): Promise<Response> {
    const url = this.#base + path;
    const init: RequestInit = {
      method,
      headers: { Authorization: `Bearer ${this.#o.link.accessToken}`, ...r.headers },
      cache: "no-store",
      // The relay never redirects; following one would carry the bearer elsewhere.
      redirect: "error",
    };
    if (r.body !== undefined) init.body = r.body as Uint8Array<ArrayBuffer>;
    const f = this.#fetch;
    for (let attempt = 0; ; attempt++) {
      let resp: Response;
      try {
        resp = await f(url, init);
      } catch (e) {
        throw new NetworkError(`mailbox: ${op}: no answer from ${this.#o.relay}: ${(e as Error)?.message ?? String(e)}`, e);
      }
      if (r.ok.includes(resp.status)) return resp;
      const err = await relayErrorOf(resp, `mailbox: ${op}`);
      const wait = err.retryAfter ?? 1;
      // A HEAD's 429 has no body to name its code (http_429): every 429
      // but too_many_watchers is a bucket's.
      if (attempt === 0 && !r.noRetry && err.status === 429 && err.code !== "too_many_watchers" && (this.#o.retryRateLimited ?? true) && wait <= MAX_AUTO_RETRY_S) {
        await sleep(wait * 1000);
        continue;
      }
      throw err;
    }
  }
}

function checkNotify(notify: Notify | undefined, op: string): void {
  if (notify !== undefined && notify !== "alert" && notify !== "silent") {
    throw new TypeError(`mailbox: ${op}: notify ${JSON.stringify(notify)} is not "alert" or "silent"`);
  }
}

function checkLimit(limit: number, op: string): void {
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_BATCH_LIMIT) {
    throw new RangeError(`mailbox: ${op}: limit ${String(limit)} is not an integer from 1 to ${MAX_BATCH_LIMIT}`);
  }
}

/** A success body, at most MAX_BODY bytes (ProtocolError too_large_answer beyond). */
async function readBody(resp: Response, op: string): Promise<Uint8Array> {
  const len = Number(resp.headers.get("Content-Length") ?? "0");
  if (len > MAX_BODY) {
    await resp.body?.cancel();
    throw new ProtocolError("too_large_answer", `mailbox: ${op}: answer of ${len} bytes, over ${MAX_BODY}`);
  }
  let buf: ArrayBuffer;
  try {
    buf = await resp.arrayBuffer();
  } catch (e) {
    throw new NetworkError(`mailbox: ${op}: the answer broke off: ${(e as Error)?.message ?? String(e)}`, e);
  }
  if (buf.byteLength > MAX_BODY) throw new ProtocolError("too_large_answer", `mailbox: ${op}: answer over ${MAX_BODY} bytes`);
  return new Uint8Array(buf);
}
