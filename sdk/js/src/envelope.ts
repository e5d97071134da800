// Envelopes (spec/mailbox.md, section Envelope layout), byte for byte the Go
// SDK's sdk/link (seal.go, reader.go):
//
//   offset 0      1 byte   version, 0x01
//   offset 1      8 bytes  sequence, unsigned big-endian, >= 1
//   offset 9      n bytes  AES-256-GCM ciphertext of the message
//   offset 9+n   16 bytes  GCM tag
//
// nonce = 4 zero bytes || the 8 sequence bytes; AAD = the first 9 bytes.
// WebCrypto's AES-GCM output is the ciphertext followed by the 16-byte tag,
// which is exactly the tail of the layout.

import { utf8 } from "./bytes.js";

/** Why an envelope or signal frame was refused. */
export type SealErrorCode = "malformed" | "bad_tag" | "replay" | "stale";

/**
 * An envelope or signal frame that does not open: `malformed` (too short,
 * another version, sequence 0 or above 2^53-1), `bad_tag` (sealed under
 * another key, or changed), `replay` (its sequence or counter was accepted
 * before), `stale` (a signal frame more than 5 minutes from this clock).
 */
export class SealError extends Error {
  /** What failed; the message says more. */
  readonly code: SealErrorCode;
  constructor(code: SealErrorCode, message: string) {
    super(message);
    this.name = "SealError";
    this.code = code;
  }
}

/** The first byte of every envelope and signal frame. */
export const ENVELOPE_VERSION = 0x01;
/** The version byte and the sequence: the AAD. */
export const ENVELOPE_HEADER_SIZE = 9;
/** The GCM tag that ends an envelope. */
export const ENVELOPE_TAG_SIZE = 16;
/** What sealing adds to a message (9 header + 16 tag); also the smallest envelope, the relay's lower bound. */
export const ENVELOPE_OVERHEAD = 25;

const TWO_32 = 2 ** 32;

/** Throws RangeError unless seq is an integer 1..2^53-1, the sequences this SDK handles. */
export function checkSequence(seq: number, what = "sequence"): void {
  if (!Number.isSafeInteger(seq) || seq < 1) {
    throw new RangeError(`envelope: ${what} ${String(seq)} is not an integer from 1 to ${Number.MAX_SAFE_INTEGER}`);
  }
}

/** The 9-byte header of seq (which checkSequence has passed). */
function header(seq: number): Uint8Array<ArrayBuffer> {
  const h = new Uint8Array(ENVELOPE_HEADER_SIZE);
  const v = new DataView(h.buffer);
  h[0] = ENVELOPE_VERSION;
  v.setUint32(1, Math.floor(seq / TWO_32));
  v.setUint32(5, seq >>> 0);
  return h;
}

/** The nonce of the 8 sequence bytes at offset 1 of hdr: 4 zero bytes before them. */
function nonce(hdr: Uint8Array): Uint8Array<ArrayBuffer> {
  const n = new Uint8Array(12);
  n.set(hdr.subarray(1, ENVELOPE_HEADER_SIZE), 4);
  return n;
}

function subtle(): SubtleCrypto {
  const s = globalThis.crypto?.subtle;
  if (!s) throw new Error("envelope: crypto.subtle is not available (WebCrypto needs a secure context in browsers)");
  return s;
}

function asBytes(plaintext: Uint8Array | string): Uint8Array {
  if (typeof plaintext === "string") return utf8(plaintext);
  if (plaintext instanceof Uint8Array) return plaintext;
  throw new TypeError(`envelope: plaintext must be a Uint8Array or a string, got ${typeof plaintext}`);
}

/**
 * Seals plaintext (a string is UTF-8 encoded) as the envelope of sequence
 * seq under key (Link.envelopeKey of the direction written). Rejects with
 * RangeError unless seq is an integer 1..2^53-1.
 *
 * The writer must never seal two messages with one sequence under one key:
 * the nonce is the sequence, and a repeated GCM nonce gives the key away.
 */
export async function sealEnvelope(key: CryptoKey, seq: number, plaintext: Uint8Array | string): Promise<Uint8Array> {
  checkSequence(seq);
  const bytes = asBytes(plaintext);
  const h = header(seq);
  const body = await subtle().encrypt(
    { name: "AES-GCM", iv: nonce(h), additionalData: h, tagLength: ENVELOPE_TAG_SIZE * 8 },
    key,
    bytes as Uint8Array<ArrayBuffer>,
  );
  const out = new Uint8Array(ENVELOPE_HEADER_SIZE + body.byteLength);
  out.set(h, 0);
  out.set(new Uint8Array(body), ENVELOPE_HEADER_SIZE);
  return out;
}

/**
 * The sequence in bytes 1..8 of an envelope, as the relay reads it, without
 * opening it: it is not authenticated until openEnvelope succeeds. Throws
 * SealError malformed for what openEnvelope would call malformed: under 25
 * bytes, another version, sequence 0, or a sequence above 2^53-1 (which a JS
 * number cannot hold exactly; the Go SDK would accept it).
 */
export function envelopeSequence(envelope: Uint8Array): number {
  if (!(envelope instanceof Uint8Array)) {
    throw new SealError("malformed", `envelope: expected a Uint8Array, got ${typeof envelope}`);
  }
  if (envelope.length < ENVELOPE_OVERHEAD) {
    throw new SealError("malformed", `envelope: ${envelope.length} bytes, shorter than ${ENVELOPE_OVERHEAD}`);
  }
  if (envelope[0] !== ENVELOPE_VERSION) {
    throw new SealError("malformed", `envelope: version byte 0x${envelope[0]!.toString(16).padStart(2, "0")} is not 0x01`);
  }
  const v = new DataView(envelope.buffer, envelope.byteOffset + 1, 8);
  const hi = v.getUint32(0);
  const lo = v.getUint32(4);
  if (hi > 0x1fffff) {
    throw new SealError("malformed", `envelope: sequence ${(BigInt(hi) << 32n) | BigInt(lo)} is above 2^53-1, which this SDK does not handle`);
  }
  const seq = hi * TWO_32 + lo;
  if (seq === 0) throw new SealError("malformed", "envelope: sequence 0");
  return seq;
}

/**
 * Checks an envelope and opens it under key (Link.envelopeKey of the
 * direction read). Rejects with SealError malformed (see envelopeSequence)
 * or bad_tag (the tag does not verify: another key, or a changed byte).
 * It does not know which sequences were accepted before; EnvelopeReader does.
 */
export async function openEnvelope(key: CryptoKey, envelope: Uint8Array): Promise<{ seq: number; plaintext: Uint8Array }> {
  const seq = envelopeSequence(envelope);
  const h = envelope.subarray(0, ENVELOPE_HEADER_SIZE);
  let pt: ArrayBuffer;
  try {
    pt = await subtle().decrypt(
      { name: "AES-GCM", iv: nonce(h), additionalData: h as Uint8Array<ArrayBuffer>, tagLength: ENVELOPE_TAG_SIZE * 8 },
      key,
      envelope.subarray(ENVELOPE_HEADER_SIZE) as Uint8Array<ArrayBuffer>,
    );
  } catch (e) {
    // WebCrypto reports a failed tag as OperationError; anything else
    // (a key for another algorithm or without "decrypt") is the caller's
    // mistake and goes up as it is.
    if (e instanceof Error && e.name === "OperationError") {
      throw new SealError("bad_tag", `envelope ${seq}: does not authenticate (bad tag)`);
    }
    throw e;
  }
  return { seq, plaintext: new Uint8Array(pt) };
}

/**
 * How many sequences above its floor an EnvelopeReader tracks one by one:
 * the relay's default RELAY_MAX_STORED (4,096 envelopes per direction), so
 * a reader that fetches whatever the relay holds, in any order, stays inside.
 */
export const REPLAY_WINDOW = 4096;

/**
 * Opens the envelopes of one direction and drops replays, with the Go SDK's
 * link.Reader rules exactly. It keeps a floor, at and below which every
 * sequence counts as accepted, and one bit for each of the REPLAY_WINDOW
 * sequences above it. The floor rises over every run of accepted sequences,
 * so a reader fed in order (the relay serves ascending sequences) keeps no
 * bits at all.
 *
 * An envelope more than REPLAY_WINDOW above the floor moves the floor up to
 * REPLAY_WINDOW below it; sequences the floor passes over without having
 * been accepted are given up, and refused as replays should they come later.
 *
 * Concurrent accept() calls are safe: each decrypts first, then checks and
 * updates the state in one synchronous step.
 */
export class EnvelopeReader {
  readonly #key: CryptoKey;
  #floor: number;
  // Bit s % REPLAY_WINDOW is set when sequence s, floor < s <= floor +
  // REPLAY_WINDOW, was accepted. Bits at or below the floor are kept clear,
  // so each bit stands for one sequence at a time.
  readonly #seen = new Uint32Array(REPLAY_WINDOW / 32);

  /**
   * A reader for key (Link.envelopeKey of the direction read) that counts
   * every sequence at or below floor (default 0: a new link) as accepted.
   * Throws RangeError unless floor is an integer 0..2^53-1.
   */
  constructor(key: CryptoKey, floor = 0) {
    if (!Number.isSafeInteger(floor) || floor < 0) {
      throw new RangeError(`envelope: reader floor ${String(floor)} is not an integer from 0 to ${Number.MAX_SAFE_INTEGER}`);
    }
    this.#key = key;
    this.#floor = floor;
  }

  /**
   * The highest sequence at or below which every sequence was accepted (or
   * given up). Persist it, and pass it as the relay's `after` to fetch only
   * what is new: accepted sequences above it are held only in memory.
   */
  get floor(): number {
    return this.#floor;
  }

  /**
   * Opens an envelope and accepts its sequence. Rejects with SealError
   * malformed or bad_tag as openEnvelope does, and replay for a sequence
   * accepted (or given up) before; in all three cases nothing changes, so a
   * forged envelope cannot disturb what the reader remembers.
   */
  async accept(envelope: Uint8Array): Promise<{ seq: number; plaintext: Uint8Array }> {
    const opened = await openEnvelope(this.#key, envelope);
    const seq = opened.seq;
    // From here on, synchronous: no other accept() runs in between.
    if (seq <= this.#floor) throw this.#replay(seq);
    if (seq - this.#floor > REPLAY_WINDOW) {
      // Beyond the window: no bit stands for seq yet. Raising the floor
      // clears the bit seq takes over.
      this.#raiseFloor(seq - REPLAY_WINDOW);
    } else if (this.#has(seq)) {
      throw this.#replay(seq);
    }
    this.#set(seq, true);
    while (this.#has(this.#floor + 1)) {
      this.#set(this.#floor + 1, false);
      this.#floor++;
    }
    return opened;
  }

  #replay(seq: number): SealError {
    return new SealError("replay", `envelope ${seq}: already accepted or given up (replay; reader floor ${this.#floor})`);
  }

  /** Moves the floor up to f, clearing the bits of the sequences it passes so they can stand for ones above the new window. */
  #raiseFloor(f: number): void {
    if (f - this.#floor >= REPLAY_WINDOW) {
      this.#seen.fill(0);
    } else {
      for (let s = this.#floor + 1; s <= f; s++) this.#set(s, false);
    }
    this.#floor = f;
  }

  #has(seq: number): boolean {
    const i = seq % REPLAY_WINDOW;
    return (this.#seen[i >>> 5]! & (1 << (i & 31))) !== 0;
  }

  #set(seq: number, on: boolean): void {
    const i = seq % REPLAY_WINDOW;
    if (on) this.#seen[i >>> 5]! |= 1 << (i & 31);
    else this.#seen[i >>> 5]! &= ~(1 << (i & 31));
  }
}
