// The batch body of GET …/<dir>?after=&limit= (spec/mailbox.md, Core
// endpoints): each envelope as a 4-byte big-endian length, then its bytes.
// The same rules as the Go SDK's mailbox.DecodeBatch.

import { ProtocolError } from "./errors.js";

/** The Content-Type of a batch answer. */
export const BATCH_CONTENT_TYPE = "application/vnd.zerobyte.batch";

/** The smallest envelope the relay stores (9 header + 16 tag bytes); envelope.ts's ENVELOPE_OVERHEAD. */
const MIN_ENVELOPE = 25;

/**
 * Splits a batch body (application/vnd.zerobyte.batch) into its envelopes,
 * in order. The envelopes are views of body's memory (no copies).
 *
 * Strict, because a batch that does not parse exactly was cut or is not a
 * batch, and guessing would hand the reader garbage: a length prefix cut
 * short, a length past the end, or a length under 25 (the relay never stores
 * a shorter envelope) throws ProtocolError `malformed_batch`. An empty body
 * is a batch of none.
 */
export function decodeBatch(body: Uint8Array): Uint8Array[] {
  if (!(body instanceof Uint8Array)) throw new TypeError(`batch: body must be a Uint8Array, got ${typeof body}`);
  const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const out: Uint8Array[] = [];
  let off = 0;
  while (off < body.length) {
    if (body.length - off < 4) {
      throw new ProtocolError("malformed_batch", `batch: ${body.length - off} bytes at offset ${off}, a length prefix needs 4`);
    }
    const n = view.getUint32(off);
    off += 4;
    if (n < MIN_ENVELOPE) {
      throw new ProtocolError("malformed_batch", `batch: envelope ${out.length} is ${n} bytes, under the ${MIN_ENVELOPE}-byte minimum`);
    }
    if (n > body.length - off) {
      throw new ProtocolError("malformed_batch", `batch: envelope ${out.length} announces ${n} bytes, ${body.length - off} remain`);
    }
    out.push(body.subarray(off, off + n));
    off += n;
  }
  return out;
}

/** The batch body of envelopes (the relay's encoding; for tests and fakes). */
export function encodeBatch(envelopes: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const e of envelopes) n += 4 + e.length;
  const out = new Uint8Array(n);
  const view = new DataView(out.buffer);
  let off = 0;
  for (const e of envelopes) {
    view.setUint32(off, e.length);
    out.set(e, off + 4);
    off += 4 + e.length;
  }
  return out;
}
