// Byte helpers the SDK needs on both sides of the wire: base64url (link codes,
// access tokens), standard base64 (TURN credentials, JSON bodies), hex (test
// vectors) and UTF-8. Written out by hand rather than with atob/btoa: those
// work on "binary strings", accept whitespace and non-canonical input, and
// this module must behave the same in every browser and in Node.

const STD = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/** Reverse tables: char code -> 6-bit value, -1 for a character outside the alphabet. */
function reverse(alphabet: string): Int16Array {
  const t = new Int16Array(128).fill(-1);
  for (let i = 0; i < alphabet.length; i++) t[alphabet.charCodeAt(i)] = i;
  return t;
}
const STD_REV = reverse(STD);
const URL_REV = reverse(URL);

function encode(bytes: Uint8Array, alphabet: string, pad: boolean): string {
  let out = "";
  let i = 0;
  for (; i + 3 <= bytes.length; i += 3) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8) | bytes[i + 2]!;
    out += alphabet[n >>> 18]! + alphabet[(n >>> 12) & 63]! + alphabet[(n >>> 6) & 63]! + alphabet[n & 63]!;
  }
  const rest = bytes.length - i;
  if (rest === 1) {
    const n = bytes[i]! << 16;
    out += alphabet[n >>> 18]! + alphabet[(n >>> 12) & 63]! + (pad ? "==" : "");
  } else if (rest === 2) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8);
    out += alphabet[n >>> 18]! + alphabet[(n >>> 12) & 63]! + alphabet[(n >>> 6) & 63]! + (pad ? "=" : "");
  }
  return out;
}

/**
 * Strict decoding: only the alphabet, the exact padding (or none), and zero
 * unused bits in the last character, so that every byte string has exactly
 * one accepted text (a link code or token cannot be spelled two ways).
 */
function decode(s: string, rev: Int16Array, padded: boolean, what: string): Uint8Array {
  if (typeof s !== "string") throw new TypeError(`${what}: expected a string, got ${typeof s}`);
  let body = s;
  if (padded) {
    if (s.length % 4 !== 0) throw new TypeError(`${what}: length ${s.length} is not a multiple of 4`);
    if (s.endsWith("==")) body = s.slice(0, -2);
    else if (s.endsWith("=")) body = s.slice(0, -1);
  }
  if (body.length % 4 === 1) throw new TypeError(`${what}: length ${body.length} cannot be base64`);
  const out = new Uint8Array(Math.floor((body.length * 3) / 4));
  let acc = 0;
  let bits = 0;
  let o = 0;
  for (let i = 0; i < body.length; i++) {
    const c = body.charCodeAt(i);
    const v = c < 128 ? rev[c]! : -1;
    if (v < 0) throw new TypeError(`${what}: invalid character ${JSON.stringify(body[i])} at offset ${i}`);
    acc = ((acc << 6) | v) & 0xffffff;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (acc >>> bits) & 0xff;
    }
  }
  if (bits > 0 && (acc & ((1 << bits) - 1)) !== 0) {
    throw new TypeError(`${what}: non-zero trailing bits (not canonical base64)`);
  }
  return out;
}

/** base64url without padding (RFC 4648 section 5), as link ids, link codes and access tokens use. */
export function b64url(bytes: Uint8Array): string {
  return encode(bytes, URL, false);
}

/**
 * Decodes base64url without padding. Throws TypeError on any other input:
 * padding, characters outside `A-Z a-z 0-9 - _`, an impossible length or
 * non-zero trailing bits.
 */
export function fromB64url(s: string): Uint8Array {
  return decode(s, URL_REV, false, "base64url");
}

/** Standard base64 with padding (RFC 4648 section 4). */
export function b64std(bytes: Uint8Array): string {
  return encode(bytes, STD, true);
}

/**
 * Decodes padded standard base64. Throws TypeError on anything else (missing
 * padding, URL-safe characters, whitespace, non-zero trailing bits).
 */
export function fromB64std(s: string): Uint8Array {
  return decode(s, STD_REV, true, "base64");
}

/** Lowercase hex. */
export function hex(bytes: Uint8Array): string {
  let out = "";
  for (const b of bytes) out += (b < 16 ? "0" : "") + b.toString(16);
  return out;
}

/** Decodes hex (either case). Throws TypeError on an odd length or a non-hex character. */
export function fromHex(s: string): Uint8Array {
  if (typeof s !== "string") throw new TypeError(`hex: expected a string, got ${typeof s}`);
  if (s.length % 2 !== 0) throw new TypeError(`hex: odd length ${s.length}`);
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) {
    const pair = s.slice(2 * i, 2 * i + 2);
    if (!/^[0-9a-fA-F]{2}$/.test(pair)) throw new TypeError(`hex: invalid digits ${JSON.stringify(pair)} at offset ${2 * i}`);
    out[i] = parseInt(pair, 16);
  }
  return out;
}

const encoder = new TextEncoder();
// fatal: a message that is not UTF-8 is an error to report, not text to
// show with replacement characters.
const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** UTF-8 encoding of s (a lone surrogate becomes U+FFFD, as TextEncoder does). */
export function utf8(s: string): Uint8Array {
  return encoder.encode(s);
}

/** Decodes UTF-8. Throws TypeError when bytes are not valid UTF-8. A leading BOM is kept. */
export function fromUtf8(bytes: Uint8Array): string {
  return decoder.decode(bytes);
}

/** The parts one after another, in a new array. */
export function concat(...parts: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
