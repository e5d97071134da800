// The agent relay's client side (spec/agent-relay.md, Clients): a WebSocket
// attachment to one instance, through which a browser or phone talks NDJSON
// frames with the agent runtime. The relay sets instance and session on
// every frame we send, answers our relay.heartbeat, and routes the
// runtime's frames for our session back to us; it never parses payloads,
// so AgentFrame keeps the payload's raw text.

import { parseAgentFrame, type AgentFrame } from "./agentframe.js";
import { SocketClosedError } from "./errors.js";
import { socketURL } from "./signal.js";

export type { AgentFrame } from "./agentframe.js";

/** Options of an AgentClient. */
export interface AgentClientOptions {
  /** The agent listener's origin, https://… (wss://… also accepted). */
  relay: string;
  /** The instance id to attach to. */
  instance: string;
  /** A client token of the instance's account. */
  token: string;
  /** The WebSocket class to use (default globalThis.WebSocket). */
  WebSocket?: typeof WebSocket;
  /** Reattach after the socket drops (default true): backoff from 250 ms doubling to 15 s, with jitter. */
  reconnect?: boolean;
  /** Interval of relay.heartbeat requests, ms (default 15000); a heartbeat not acked within it closes the socket (and reattaches). 0: none. */
  heartbeatMs?: number;
}

/** A relay.error answering a request: code is the payload's code (unknown_instance, malformed_frame, unsupported_type…). */
export class AgentError extends Error {
  /** The relay.error's payload.code ("relay_error" when it has none). */
  readonly code: string;
  /** The relay.error frame. */
  readonly frame: AgentFrame;
  constructor(frame: AgentFrame) {
    const p = frame.payload as { code?: unknown; message?: unknown } | undefined;
    const code = typeof p?.code === "string" && p.code ? p.code : "relay_error";
    const msg = typeof p?.message === "string" ? p.message : "";
    super(`agent: relay error ${code}${msg ? ": " + msg : ""} (re ${frame.re ?? "?"})`);
    this.name = "AgentError";
    this.code = code;
    this.frame = frame;
  }
}

/** A request that got no answer within its timeout. */
export class AgentTimeoutError extends Error {
  /** The request's id. */
  readonly id: string;
  /** The timeout that passed, ms. */
  readonly timeoutMs: number;
  constructor(id: string, type: string, timeoutMs: number) {
    super(`agent: no answer to ${type} (id ${id}) within ${timeoutMs} ms`);
    this.name = "AgentTimeoutError";
    this.id = id;
    this.timeoutMs = timeoutMs;
  }
}

/** The default of request()'s timeoutMs. */
export const AGENT_REQUEST_TIMEOUT_MS = 30_000;
/** The default heartbeat interval, as the real connector's. */
export const AGENT_HEARTBEAT_MS = 15_000;
const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 15_000;
/** Our client-side close code for a heartbeat that was not acked (4000-4999 are the application's). */
export const CLOSE_HEARTBEAT_TIMEOUT = 4001;

interface Pending {
  resolve(f: AgentFrame): void;
  reject(e: Error): void;
  timer: ReturnType<typeof setTimeout>;
}

/**
 * An attachment to one agent instance. connect() attaches; after a drop it
 * reattaches on its own (reconnect) with a new session: requests pending
 * at the drop reject with SocketClosedError, and the runtime sees the old
 * session's acp.detach.
 */
export class AgentClient {
  /** Every frame the runtime or the relay sends us, except answers to request() and heartbeat acks. */
  onframe: ((f: AgentFrame) => void) | null = null;
  /** "connecting" while (re)attaching, "open" when attached, "closed" when the socket is down for good or between attempts. */
  onstate: ((s: "connecting" | "open" | "closed") => void) | null = null;

  readonly #o: AgentClientOptions;
  readonly #url: string;
  #ws: WebSocket | null = null;
  #state: "connecting" | "open" | "closed" = "closed";
  #closedByUs = false;
  #attempts = 0;
  #retry: ReturnType<typeof setTimeout> | undefined;
  #hb: ReturnType<typeof setInterval> | undefined;
  #hbWanted = "";
  #nextId = 0;
  #malformed = 0;
  #attaches = 0;
  readonly #prefix = randomHex(4);
  readonly #pending = new Map<string, Pending>();

  /** A client for o; nothing is dialed until connect(). */
  constructor(o: AgentClientOptions) {
    if (!o.instance || typeof o.instance !== "string") throw new TypeError("agent: instance required");
    if (!o.token || typeof o.token !== "string") throw new TypeError("agent: token required");
    this.#o = o;
    this.#url = socketURL(o.relay, `/v1/attach/${encodeURIComponent(o.instance)}`);
  }

  /** The socket's state. */
  get state(): "connecting" | "open" | "closed" {
    return this.#state;
  }

  /** Lines from the relay that did not parse as a frame (dropped). */
  get malformed(): number {
    return this.#malformed;
  }

  /** How many times the socket has opened (1 after connect(), 1 more per reattach). */
  get attaches(): number {
    return this.#attaches;
  }

  /**
   * Attaches: GET /v1/attach/<instance> with subprotocols
   * `contenox-relay.v1` and `bearer.<token>`. Resolves when the socket is
   * open. Rejects with SocketClosedError when it closes before opening: a
   * refused upgrade (403 for another account's or an unknown instance,
   * 401 for a bad token, 429 past 64 attachments) shows as code 1006,
   * since browsers do not expose the status. A refused first attach is not
   * retried.
   */
  connect(): Promise<void> {
    this.#closedByUs = false;
    clearTimeout(this.#retry);
    return this.#dial();
  }

  #dial(): Promise<void> {
    const WS = this.#o.WebSocket ?? globalThis.WebSocket;
    if (typeof WS !== "function") return Promise.reject(new TypeError("agent: no WebSocket (pass options.WebSocket)"));
    this.#setState("connecting");
    const ws = new WS(this.#url, ["contenox-relay.v1", `bearer.${this.#o.token}`]);
    this.#ws = ws;
    return new Promise((resolve, reject) => {
      let opened = false;
      ws.onopen = () => {
        if (this.#ws !== ws) return;
        opened = true;
        this.#attempts = 0;
        this.#attaches++;
        this.#startHeartbeat(ws);
        this.#setState("open");
        resolve();
      };
      ws.onmessage = (e: MessageEvent) => {
        if (this.#ws === ws && typeof e.data === "string") this.#receive(e.data);
      };
      const ended = (code: number, reason: string) => {
        if (this.#ws !== ws) return; // handled already (error, then close)
        this.#ws = null;
        this.#stopHeartbeat();
        const what = `${code}${reason ? " " + reason : ""}`;
        this.#rejectPending(new SocketClosedError(code, reason, `agent: attachment to ${this.#o.instance} closed (${what})`));
        if (!opened) reject(new SocketClosedError(code, reason, `agent: attach to ${this.#o.instance} refused or failed (${what}; a refused upgrade shows as 1006)`));
        this.#setState("closed");
        // Reattach after a drop of an attachment that was open, or of a
        // reattach attempt; never after close() or a refused first attach.
        if (!this.#closedByUs && (this.#o.reconnect ?? true) && (opened || this.#attaches > 0)) this.#scheduleRetry();
      };
      // A failed upgrade: browsers fire error then close 1006; Node 20's
      // WebSocket fires only the error.
      ws.onerror = () => {
        if (!opened) ended(1006, "");
      };
      ws.onclose = (e: CloseEvent) => ended(e.code, e.reason);
    });
  }

  #scheduleRetry(): void {
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** this.#attempts);
    this.#attempts++;
    const delay = base / 2 + Math.random() * (base / 2);
    this.#retry = setTimeout(() => {
      if (!this.#closedByUs) this.#dial().catch(() => {}); // its close schedules the next try
    }, delay);
  }

  #setState(s: "connecting" | "open" | "closed"): void {
    if (this.#state === s) return;
    this.#state = s;
    this.onstate?.(s);
  }

  #startHeartbeat(ws: WebSocket): void {
    const every = this.#o.heartbeatMs ?? AGENT_HEARTBEAT_MS;
    if (!(every > 0)) return;
    let n = 0;
    this.#hbWanted = "";
    this.#hb = setInterval(() => {
      if (this.#hbWanted) {
        // The last one is unanswered after a whole interval: the path is
        // dead even if the socket does not know yet.
        ws.close(CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout");
        return;
      }
      this.#hbWanted = `hb-${this.#prefix}-${++n}`;
      ws.send(JSON.stringify({ type: "relay.heartbeat", id: this.#hbWanted }));
    }, every);
  }

  #stopHeartbeat(): void {
    clearInterval(this.#hb);
    this.#hbWanted = "";
  }

  #receive(line: string): void {
    let f: AgentFrame;
    try {
      f = parseAgentFrame(line);
    } catch {
      this.#malformed++;
      return;
    }
    if (f.re !== undefined) {
      if (f.type === "relay.ack" && f.re === this.#hbWanted) {
        this.#hbWanted = "";
        return;
      }
      const p = this.#pending.get(f.re);
      if (p) {
        this.#pending.delete(f.re);
        clearTimeout(p.timer);
        if (f.type === "relay.error") p.reject(new AgentError(f));
        else p.resolve(f);
        return;
      }
    }
    this.onframe?.(f);
  }

  /**
   * Sends one frame: an object is written with JSON.stringify (one line,
   * always); a string is sent as it is after a check that it is one JSON
   * object without CR or LF (the relay drops anything else, and a line
   * feed would split it on the link). Throws TypeError for a bad frame,
   * SocketClosedError when not attached.
   */
  send(frame: { type: string; [k: string]: unknown } | string): void {
    let line: string;
    if (typeof frame === "string") {
      if (/[\r\n]/.test(frame)) throw new TypeError("agent: a frame must not hold CR or LF");
      let v: unknown;
      try {
        v = JSON.parse(frame);
      } catch (e) {
        throw new TypeError(`agent: frame is not JSON: ${(e as Error).message}`);
      }
      if (v === null || typeof v !== "object" || Array.isArray(v)) throw new TypeError("agent: frame is not a JSON object");
      line = frame;
    } else {
      if (frame === null || typeof frame !== "object" || typeof frame.type !== "string" || !frame.type) {
        throw new TypeError("agent: frame needs a non-empty string type");
      }
      line = JSON.stringify(frame);
    }
    const ws = this.#ws;
    if (!ws || this.#state !== "open") throw new SocketClosedError(1006, "", `agent: not attached to ${this.#o.instance} (state ${this.#state})`);
    ws.send(line);
  }

  /**
   * Sends {type, id, payload} with a fresh id and resolves with the frame
   * whose re is that id. opts.payloadRaw, instead of payload, is JSON text
   * sent as the payload byte for byte (what JSON.stringify cannot write:
   * integers beyond 2^53, duplicate keys). Rejects with AgentError when the relay answers
   * relay.error (unknown_instance while the instance is offline),
   * AgentTimeoutError after timeoutMs (default 30000), SocketClosedError
   * when the socket drops first or is not attached.
   */
  request(type: string, payload?: unknown, opts?: { timeoutMs?: number; payloadRaw?: string }): Promise<AgentFrame> {
    const id = `${this.#prefix}-${++this.#nextId}`;
    const frame: { type: string; id: string; payload?: unknown } = { type, id };
    if (payload !== undefined) frame.payload = payload;
    try {
      if (opts?.payloadRaw !== undefined) {
        // The payload's text goes in as it is (big numbers, duplicate keys
        // and spacing survive); send() checks the line is one object.
        if (payload !== undefined) throw new TypeError("agent: request with both payload and payloadRaw");
        const head = JSON.stringify(frame);
        this.send(`${head.slice(0, -1)},"payload":${opts.payloadRaw}}`);
      } else {
        this.send(frame);
      }
    } catch (e) {
      return Promise.reject(e);
    }
    const ms = opts?.timeoutMs ?? AGENT_REQUEST_TIMEOUT_MS;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new AgentTimeoutError(id, type, ms));
      }, ms);
      this.#pending.set(id, { resolve, reject, timer });
    });
  }

  #rejectPending(e: Error): void {
    for (const [id, p] of this.#pending) {
      clearTimeout(p.timer);
      this.#pending.delete(id);
      p.reject(e);
    }
  }

  /** Detaches (1000) and stops reattaching. Pending requests reject with SocketClosedError. */
  close(): void {
    this.#closedByUs = true;
    clearTimeout(this.#retry);
    const ws = this.#ws;
    if (ws) {
      ws.close(1000);
    } else {
      this.#setState("closed");
    }
  }
}

function randomHex(n: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(n)), (b) => b.toString(16).padStart(2, "0")).join("");
}
