// The link: the pairing of one primary and one companion, and the keys both
// derive from the link key (spec/mailbox.md, section Keys). Byte for byte
// the Go SDK's sdk/link (link.go): HKDF-SHA256 with ikm = the link key,
// salt = the link id's ASCII bytes, info = the label, 32 bytes.

import { b64url, fromB64url, utf8 } from "./bytes.js";

/** Which device writes: `p2c` the primary (the companion reads), `c2p` the companion. */
export type Direction = "p2c" | "c2p";

/** The two devices of a link: the primary (a computer) and the companion (a phone). */
export type Role = "primary" | "companion";

/** The direction a role writes: primary -> "p2c", companion -> "c2p". Throws TypeError for any other role. */
export function writes(role: Role): Direction {
  if (role === "primary") return "p2c";
  if (role === "companion") return "c2p";
  throw new TypeError(`link: unknown role ${JSON.stringify(role)} (want "primary" or "companion")`);
}

/** The direction a role reads: the one the other device writes. Throws TypeError for any other role. */
export function reads(role: Role): Direction {
  return writes(role) === "p2c" ? "c2p" : "p2c";
}

/** Size in bytes of the link key and of every key derived from it. */
export const KEY_SIZE = 32;

/** How many random bytes a generated link id encodes (22 base64url characters). */
const ID_BYTES = 16;

/** HKDF labels (info) of spec/mailbox.md; the "zerobyte" prefix keeps existing clients' keys. */
export const LABELS = {
  access: "zerobyte-access-v1",
  p2c: "zerobyte-p2c-v1",
  c2p: "zerobyte-c2p-v1",
  signalP2c: "zerobyte-signal-p2c-v1",
  signalC2p: "zerobyte-signal-c2p-v1",
} as const;

const ID_PATTERN = /^[A-Za-z0-9_-]{16,64}$/;

/** Throws TypeError unless key is a 32-byte Uint8Array. */
function checkKey(key: unknown): asserts key is Uint8Array {
  if (!(key instanceof Uint8Array)) throw new TypeError(`link: key must be a Uint8Array, got ${describe(key)}`);
  if (key.length !== KEY_SIZE) throw new TypeError(`link: key is ${key.length} bytes, want ${KEY_SIZE}`);
}

/** Throws TypeError unless id is what the relay accepts as a mailbox id. */
function checkId(id: unknown): asserts id is string {
  if (typeof id !== "string") throw new TypeError(`link: id must be a string, got ${describe(id)}`);
  if (!ID_PATTERN.test(id)) {
    throw new TypeError(`link: id ${JSON.stringify(id.length > 80 ? id.slice(0, 80) + "…" : id)} is not 16 to 64 characters of A-Z a-z 0-9 _ -`);
  }
}

function describe(v: unknown): string {
  return v === null ? "null" : typeof v === "object" ? (v.constructor?.name ?? "object") : typeof v;
}

function subtle(): SubtleCrypto {
  const s = globalThis.crypto?.subtle;
  if (!s) throw new Error("link: crypto.subtle is not available (WebCrypto needs a secure context in browsers)");
  return s;
}

/**
 * HKDF-SHA256 of the link key, salted with the link id's ASCII bytes, under
 * label: 32 raw bytes. Link uses it for every key; it is exported for tests
 * and vectors (spec/mailbox-vectors.json). Throws TypeError on a key that is
 * not 32 bytes or an id the relay would not accept.
 */
export async function deriveRaw(key: Uint8Array, id: string, label: string): Promise<Uint8Array> {
  checkKey(key);
  checkId(id);
  const ikm = await subtle().importKey("raw", key as Uint8Array<ArrayBuffer>, "HKDF", false, ["deriveBits"]);
  const bits = await subtle().deriveBits(
    { name: "HKDF", hash: "SHA-256", salt: utf8(id) as Uint8Array<ArrayBuffer>, info: utf8(label) as Uint8Array<ArrayBuffer> },
    ikm,
    KEY_SIZE * 8,
  );
  return new Uint8Array(bits);
}

/** An AES-256-GCM key from derived bytes, non-extractable: a script that gets the CryptoKey cannot read it out. */
async function aesKey(key: Uint8Array, id: string, label: string): Promise<CryptoKey> {
  const raw = await deriveRaw(key, id, label);
  try {
    return await subtle().importKey("raw", raw as Uint8Array<ArrayBuffer>, { name: "AES-GCM" }, false, ["encrypt", "decrypt"]);
  } finally {
    raw.fill(0);
  }
}

/**
 * A mailbox link, as both devices hold it. Build one with generate(),
 * fromKey() or fromCode(); the constructor is not public. Every key is
 * derived once, when the Link is made, so the accessors are synchronous.
 *
 * The link key itself is kept only to write toCode(); nothing else exposes it.
 */
export class Link {
  /** The link id, which is also the mailbox id. */
  readonly id: string;
  /** The bearer token of the mailbox: HKDF "zerobyte-access-v1", base64url without padding (43 characters). */
  readonly accessToken: string;
  readonly #key: Uint8Array;
  readonly #envelope: Readonly<Record<Direction, CryptoKey>>;
  readonly #signal: Readonly<Record<Direction, CryptoKey>>;

  private constructor(key: Uint8Array, id: string, accessToken: string, envelope: Record<Direction, CryptoKey>, signal: Record<Direction, CryptoKey>) {
    this.#key = key;
    this.id = id;
    this.accessToken = accessToken;
    this.#envelope = Object.freeze(envelope);
    this.#signal = Object.freeze(signal);
  }

  /** A fresh link: 32 random key bytes and an id of 16 random bytes (22 characters), from crypto.getRandomValues. */
  static async generate(): Promise<Link> {
    const key = crypto.getRandomValues(new Uint8Array(KEY_SIZE));
    const id = b64url(crypto.getRandomValues(new Uint8Array(ID_BYTES)));
    return Link.fromKey(key, id);
  }

  /**
   * The link of a known key and id. Throws (rejects with) TypeError unless
   * key is 32 bytes and id is 16 to 64 characters of `A-Z a-z 0-9 _ -`.
   * The key is copied: changing the caller's array later changes nothing.
   */
  static async fromKey(key: Uint8Array, id: string): Promise<Link> {
    checkKey(key);
    checkId(id);
    const k = new Uint8Array(key);
    const [access, p2c, c2p, signalP2c, signalC2p] = await Promise.all([
      deriveRaw(k, id, LABELS.access),
      aesKey(k, id, LABELS.p2c),
      aesKey(k, id, LABELS.c2p),
      aesKey(k, id, LABELS.signalP2c),
      aesKey(k, id, LABELS.signalC2p),
    ]);
    return new Link(k, id, b64url(access), { p2c, c2p }, { p2c: signalP2c, c2p: signalC2p });
  }

  /**
   * The link of a code written by toCode(): `<id>.<base64url key>`, what the
   * pairing QR code carries. Throws (rejects with) TypeError on anything
   * else: no dot or more than one, a bad id, a key that is not canonical
   * base64url of 32 bytes.
   */
  static async fromCode(code: string): Promise<Link> {
    if (typeof code !== "string") throw new TypeError(`link: code must be a string, got ${describe(code)}`);
    const parts = code.split(".");
    if (parts.length !== 2) throw new TypeError(`link: code has ${parts.length - 1} dots, want "<id>.<key>" with one`);
    const [id, key] = parts as [string, string];
    let raw: Uint8Array;
    try {
      raw = fromB64url(key);
    } catch (e) {
      throw new TypeError(`link: code's key: ${(e as Error).message}`);
    }
    return Link.fromKey(raw, id);
  }

  /** `<id>.<base64url key>`: everything the other device needs. It holds the link key: show it only to that device. */
  toCode(): string {
    return `${this.id}.${b64url(this.#key)}`;
  }

  /** The AES-256-GCM key of envelopes stored in direction dir (non-extractable). Throws TypeError for another direction. */
  envelopeKey(dir: Direction): CryptoKey {
    return pick(this.#envelope, dir, "envelopeKey");
  }

  /** The AES-256-GCM key of signal frames sent in direction dir (non-extractable). Throws TypeError for another direction. */
  signalKey(dir: Direction): CryptoKey {
    return pick(this.#signal, dir, "signalKey");
  }
}

function pick(keys: Readonly<Record<Direction, CryptoKey>>, dir: Direction, what: string): CryptoKey {
  // As the Go SDK panics: there is no key for another direction, and
  // handing one out would hide the mistake.
  if (dir !== "p2c" && dir !== "c2p") throw new TypeError(`link: ${what} of invalid direction ${JSON.stringify(dir)}`);
  return keys[dir];
}
