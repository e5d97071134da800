// The SDK's error types for what the relay answers (RelayError), how a
// socket ended (SocketClosedError) and answers that do not follow the
// protocol (ProtocolError). Crypto failures are envelope.ts's SealError.
//
// Every non-success answer of the relay is JSON: {"error":"<code>","status":<n>}
// (spec/mailbox.md, section Answers). A HEAD answer has no body, and a proxy
// in between may answer anything, so the code falls back to "http_<status>".

/**
 * An answer of the relay other than the request's success: `status` is the
 * HTTP status, `code` the `error` of its JSON body (`bad_request`,
 * `unauthorized`, `forbidden`, `not_found`, `taken`, `conflict`, `too_large`,
 * `rate_limited`, `too_many_watchers`, `upstream_unavailable`,
 * `mailbox_full`, `storage_unavailable`, ...), or `http_<status>` when the
 * body is not that JSON (a HEAD answer has no body). `retryAfter` is the
 * Retry-After header in seconds, when the relay sent one (429, 503).
 */
export class RelayError extends Error {
  /** The HTTP status, e.g. 409. */
  readonly status: number;
  /** The relay's error code, e.g. "conflict"; "http_<status>" when the answer did not carry one. */
  readonly code: string;
  /** Seconds to wait before trying again (Retry-After), when the relay said. */
  readonly retryAfter?: number;

  /** op, when given, prefixes the message: which request got the answer ("put p2c/7"). */
  constructor(status: number, code: string, opts: { retryAfter?: number | undefined; op?: string | undefined } = {}) {
    let msg = `relay answered ${status} ${code}`;
    if (opts.retryAfter !== undefined) msg += `, retry after ${opts.retryAfter} s`;
    super(opts.op ? `${opts.op}: ${msg}` : msg);
    this.name = "RelayError";
    this.status = status;
    this.code = code;
    if (opts.retryAfter !== undefined) this.retryAfter = opts.retryAfter;
  }
}

/**
 * A WebSocket that closed: `code` is the close code the SDK saw (1000 after
 * an erase, 1013 for a reader too far behind, 1006 for a connection that
 * broke or an upgrade the relay refused, which a browser cannot tell apart),
 * `reason` the close reason (often empty).
 */
export class SocketClosedError extends Error {
  /** The WebSocket close code. */
  readonly code: number;
  /** The close reason the peer sent, "" when none. */
  readonly reason: string;

  /** message defaults to one that names the code and reason. */
  constructor(code: number, reason: string, message?: string) {
    super(message ?? `socket closed with ${code}${reason ? ` ${reason}` : ""}`);
    this.name = "SocketClosedError";
    this.code = code;
    this.reason = reason;
  }
}

/**
 * A success answer that does not follow the protocol: a batch that does not
 * parse (`malformed_batch`), a missing or non-decimal header (`bad_header`),
 * another Content-Type (`bad_content_type`), an answer larger than the SDK
 * reads (`too_large_answer`), a socket that negotiated another subprotocol or
 * sent an unknown text frame (`bad_socket`). It means the answer was cut or
 * something other than the relay answered; the SDK never guesses.
 */
export class ProtocolError extends Error {
  /** What was wrong, one of the codes above. */
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.name = "ProtocolError";
    this.code = code;
  }
}

/**
 * A request that got no answer: fetch rejected (the relay is unreachable, the
 * connection broke, CORS refused it, or the request was aborted). The relay
 * may or may not have carried it out; `cause` is fetch's own error.
 */
export class NetworkError extends Error {
  constructor(message: string, cause: unknown) {
    super(message, { cause });
    this.name = "NetworkError";
  }
}

/** How much of an error answer is read: the relay's is a short JSON object. */
const MAX_ERROR_BODY = 4096;

const CODE_PATTERN = /^[a-z0-9_]{1,64}$/;

/**
 * The Retry-After header in whole seconds, undefined when absent or not a
 * non-negative decimal (the relay always sends seconds, never a date).
 */
export function retryAfterOf(resp: Response): number | undefined {
  const v = resp.headers.get("Retry-After");
  if (v === null || !/^\d{1,9}$/.test(v.trim())) return undefined;
  return Number(v.trim());
}

/**
 * The RelayError of a non-success answer: status, the JSON body's code (at
 * most 4 KiB of the body is read) and Retry-After. op, when given, names the
 * request in the message. The body is consumed.
 */
export async function relayErrorOf(resp: Response, op?: string): Promise<RelayError> {
  let code = `http_${resp.status}`;
  try {
    const text = await readBounded(resp, MAX_ERROR_BODY);
    if (text !== undefined && text !== "") {
      const body: unknown = JSON.parse(text);
      if (typeof body === "object" && body !== null) {
        const e = (body as Record<string, unknown>).error;
        const s = (body as Record<string, unknown>).status;
        if (typeof e === "string" && CODE_PATTERN.test(e) && typeof s === "number") code = e;
      }
    }
  } catch {
    // Not JSON, or the body broke off: the status says enough.
  }
  return new RelayError(resp.status, code, { retryAfter: retryAfterOf(resp), op });
}

/** At most max bytes of resp's body as text (undefined when longer: not the relay's short JSON); cancels the rest. */
async function readBounded(resp: Response, max: number): Promise<string | undefined> {
  if (!resp.body) return "";
  const reader = resp.body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      n += value.length;
      if (n > max) return undefined;
      parts.push(value);
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  const all = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    all.set(p, o);
    o += p.length;
  }
  return new TextDecoder().decode(all);
}
