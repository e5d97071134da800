// bytes.ts: RFC 4648 test vectors, strict decoding, hex, UTF-8, concat.
import { test } from "node:test";
import assert from "node:assert/strict";
import { b64url, fromB64url, b64std, fromB64std, hex, fromHex, utf8, fromUtf8, concat } from "../../dist/bytes.js";

const enc = (s) => new TextEncoder().encode(s);

test("base64: RFC 4648 section 10 vectors", () => {
  for (const [plain, std] of [
    ["", ""], ["f", "Zg=="], ["fo", "Zm8="], ["foo", "Zm9v"],
    ["foob", "Zm9vYg=="], ["fooba", "Zm9vYmE="], ["foobar", "Zm9vYmFy"],
  ]) {
    assert.equal(b64std(enc(plain)), std);
    assert.deepEqual(fromB64std(std), enc(plain));
    const url = std.replace(/=+$/, "");
    assert.equal(b64url(enc(plain)), url);
    assert.deepEqual(fromB64url(url), enc(plain));
  }
});

test("base64: the two alphabets differ in 62 and 63", () => {
  const b = new Uint8Array([0xfb, 0xff, 0xbf]);
  assert.equal(b64std(b), "+/+/");
  assert.equal(b64url(b), "-_-_");
  assert.deepEqual(fromB64std("+/+/"), b);
  assert.deepEqual(fromB64url("-_-_"), b);
  assert.throws(() => fromB64url("+/+/"), TypeError);
  assert.throws(() => fromB64std("-_-_"), TypeError);
});

test("base64: every byte value round-trips at every length mod 3", () => {
  const all = new Uint8Array(256).map((_, i) => i);
  for (let n = 254; n <= 256; n++) {
    const b = all.subarray(0, n);
    assert.deepEqual(fromB64url(b64url(b)), b);
    assert.deepEqual(fromB64std(b64std(b)), b);
    // Node's own encoder agrees.
    assert.equal(b64std(b), Buffer.from(b).toString("base64"));
    assert.equal(b64url(b), Buffer.from(b).toString("base64url"));
  }
});

test("base64url: strict (no padding, alphabet only, length, canonical trailing bits)", () => {
  for (const bad of ["Zg==", "Zg=", "Z", "Zm9vY", "Zm 9v", "Zm9v\n", "Zh", "Zm9", "Zm+v", "é", 42, null]) {
    assert.throws(() => fromB64url(bad), TypeError, String(bad));
  }
  assert.deepEqual(fromB64url("Zm8"), enc("fo"));
});

test("base64 standard: strict (exact padding, alphabet only, canonical trailing bits)", () => {
  for (const bad of ["Zg", "Zg=", "Zm8", "Zg===", "Z===", "Zh==", "Zm9=", "Zm9v=", "=Zm9", "Zg==Zg==", "Zm_v", " Zm9v", undefined]) {
    assert.throws(() => fromB64std(bad), TypeError, String(bad));
  }
});

test("hex: lowercase out, either case in, strict", () => {
  assert.equal(hex(new Uint8Array([0, 1, 0xab, 0xff])), "0001abff");
  assert.equal(hex(new Uint8Array(0)), "");
  assert.deepEqual(fromHex("0001ABff"), new Uint8Array([0, 1, 0xab, 0xff]));
  for (const bad of ["0", "0g", "+1", " 1", "1 ", "0x01", 1]) {
    assert.throws(() => fromHex(bad), TypeError, String(bad));
  }
});

test("utf8: encode, decode, invalid bytes throw", () => {
  assert.deepEqual(utf8("hé€😀"), new Uint8Array([0x68, 0xc3, 0xa9, 0xe2, 0x82, 0xac, 0xf0, 0x9f, 0x98, 0x80]));
  assert.equal(fromUtf8(utf8("hé€😀")), "hé€😀");
  assert.equal(fromUtf8(new Uint8Array(0)), "");
  assert.equal(fromUtf8(new Uint8Array([0xef, 0xbb, 0xbf, 0x41])), "\ufeffA"); // BOM kept
  assert.throws(() => fromUtf8(new Uint8Array([0xc3])), TypeError);
  assert.throws(() => fromUtf8(new Uint8Array([0xff])), TypeError);
});

test("concat", () => {
  assert.deepEqual(concat(), new Uint8Array(0));
  assert.deepEqual(concat(new Uint8Array([1]), new Uint8Array(0), new Uint8Array([2, 3])), new Uint8Array([1, 2, 3]));
  const a = new Uint8Array([9]);
  const c = concat(a);
  c[0] = 0;
  assert.equal(a[0], 9, "a new array, not the part");
});
