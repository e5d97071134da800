// Signal frames (spec/mailbox.md, section Envelope layout, last paragraph),
// byte for byte the Go SDK's sdk/link (signal.go): an envelope whose
// sequence is a counter of milliseconds since 1970, made strictly
// increasing by the sender, under Link.signalKey of the sending direction.

import { SealError, openEnvelope, sealEnvelope } from "./envelope.js";
import { utf8 } from "./bytes.js";

/** How far (inclusive) a signal frame's counter may lie from the receiver's clock, either way: 5 minutes. */
export const SIGNAL_MAX_SKEW_MS = 300_000;

/** The clock in whole milliseconds, as Go's UnixMilli truncates. */
function millis(now: () => number): number {
  return Math.floor(now());
}

/**
 * Seals the signal frames one device sends (under Link.signalKey of its
 * sending direction). The counter is the clock, or one more than the last
 * frame's when the clock has not moved past it (two frames in a millisecond,
 * a clock stepped back): the counter is the GCM nonce and must never repeat
 * under the key. A clock needs no stored state, so a restarted device keeps
 * numbering upward without remembering anything.
 */
export class SignalSealer {
  readonly #key: CryptoKey;
  readonly #now: () => number;
  #last = 0;

  /** A sealer for key that reads the time from now (ms since 1970; default Date.now). */
  constructor(key: CryptoKey, now: () => number = Date.now) {
    this.#key = key;
    this.#now = now;
  }

  /** The counter of the last frame sealed, 0 before the first. */
  get last(): number {
    return this.#last;
  }

  /**
   * The frame of plaintext (a string is UTF-8 encoded). Its counter is
   * max(now, last + 1); a clock at or before 1970 counts from last + 1, so
   * the first counter is never 0. The relay forwards frames of at most 64 KiB.
   */
  async seal(plaintext: Uint8Array | string): Promise<Uint8Array> {
    const bytes = typeof plaintext === "string" ? utf8(plaintext) : plaintext;
    if (!(bytes instanceof Uint8Array)) throw new TypeError(`signal: plaintext must be a Uint8Array or a string, got ${typeof plaintext}`);
    let counter = this.#last + 1;
    const now = millis(this.#now);
    if (now > 0 && now > counter) counter = now;
    if (!Number.isSafeInteger(counter)) throw new RangeError(`signal: counter ${counter} is above 2^53-1 (clock ${now})`);
    // Taken before encrypting, so that concurrent seal() calls never share
    // a counter (a nonce) even when one of them fails.
    this.#last = counter;
    return sealEnvelope(this.#key, counter, bytes);
  }
}

/**
 * Opens the signal frames from the other device (under Link.signalKey of
 * the other device's sending direction). It drops a frame whose counter is
 * at or below the last it accepted (frames are not reordered on a socket),
 * or more than SIGNAL_MAX_SKEW_MS from its own clock.
 *
 * Concurrent open() calls are safe: each decrypts first, then checks and
 * updates the state in one synchronous step.
 */
export class SignalOpener {
  readonly #key: CryptoKey;
  readonly #now: () => number;
  #last = 0;

  /** An opener for key that reads the time from now (ms since 1970; default Date.now). */
  constructor(key: CryptoKey, now: () => number = Date.now) {
    this.#key = key;
    this.#now = now;
  }

  /** The counter of the last frame accepted, 0 before the first. */
  get last(): number {
    return this.#last;
  }

  /**
   * Checks a frame and returns its plaintext. Rejects with SealError
   * malformed or bad_tag as openEnvelope does (the tag is checked first),
   * then replay for a counter at or below the last accepted, then stale for
   * one more than 5 minutes from the clock (exactly 5 minutes is accepted).
   * A failed frame changes nothing.
   */
  async open(frame: Uint8Array): Promise<Uint8Array> {
    const { seq: counter, plaintext } = await openEnvelope(this.#key, frame);
    if (counter <= this.#last) {
      throw new SealError("replay", `signal: counter ${counter} is at or below the last accepted, ${this.#last} (replay)`);
    }
    // A clock before 1970 counts as 1970, as in the Go SDK.
    const now = Math.max(0, millis(this.#now));
    if (!(Math.abs(counter - now) <= SIGNAL_MAX_SKEW_MS)) {
      throw new SealError("stale", `signal: counter ${counter} is ${counter - now} ms from this clock (${now}), more than ${SIGNAL_MAX_SKEW_MS} (stale)`);
    }
    this.#last = counter;
    return plaintext;
  }
}
