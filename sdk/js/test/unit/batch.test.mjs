// decodeBatch: the batch body of GET …/<dir>?after= (4-byte big-endian
// length, then the envelope), with the Go SDK's mailbox.DecodeBatch rules:
// empty is none, a cut prefix, a length past the end and a length under 25
// are ProtocolError malformed_batch.
import { test } from "node:test";
import assert from "node:assert/strict";
import { decodeBatch, encodeBatch, BATCH_CONTENT_TYPE } from "../../dist/batch.js";
import { ProtocolError } from "../../dist/errors.js";

const env = (n, fill) => new Uint8Array(n).fill(fill);
const malformed = (re) => (e) => e instanceof ProtocolError && e.code === "malformed_batch" && re.test(e.message);

test("content type", () => {
  assert.equal(BATCH_CONTENT_TYPE, "application/vnd.zerobyte.batch");
});

test("empty body: no envelopes", () => {
  assert.deepEqual(decodeBatch(new Uint8Array(0)), []);
});

test("one and several envelopes, byte for byte, in order, as views of the body", () => {
  const one = encodeBatch([env(25, 1)]);
  assert.deepEqual([...one.subarray(0, 4)], [0, 0, 0, 25]);
  assert.deepEqual(decodeBatch(one), [env(25, 1)]);

  const parts = [env(25, 1), env(300, 2), env(70000, 3)];
  const body = encodeBatch(parts);
  assert.equal(body.length, 3 * 4 + 25 + 300 + 70000);
  // 70000 = 0x00011170: all four prefix bytes count.
  assert.deepEqual([...body.subarray(4 + 25 + 4 + 300, 4 + 25 + 4 + 300 + 4)], [0x00, 0x01, 0x11, 0x70]);
  const got = decodeBatch(body);
  assert.deepEqual(got, parts);
  assert.equal(got[1].buffer, body.buffer, "a view, not a copy");
  assert.equal(got[1].byteOffset, 4 + 25 + 4);
});

test("a body that is a view into a larger buffer", () => {
  const inner = encodeBatch([env(30, 9)]);
  const big = new Uint8Array(inner.length + 10);
  big.set(inner, 5);
  assert.deepEqual(decodeBatch(big.subarray(5, 5 + inner.length)), [env(30, 9)]);
});

test("truncated length prefix: 1, 2, 3 bytes, alone or after an envelope", () => {
  for (const n of [1, 2, 3]) {
    assert.throws(() => decodeBatch(new Uint8Array(n)), malformed(new RegExp(`${n} bytes at offset 0`)));
    const body = new Uint8Array(4 + 25 + n);
    body.set(encodeBatch([env(25, 1)]));
    assert.throws(() => decodeBatch(body), malformed(new RegExp(`${n} bytes at offset 29`)));
  }
});

test("length past the end: at the end exactly is fine, one past is not", () => {
  const ok = encodeBatch([env(40, 4)]);
  assert.deepEqual(decodeBatch(ok), [env(40, 4)]);
  assert.throws(() => decodeBatch(ok.subarray(0, ok.length - 1)), malformed(/envelope 0 announces 40 bytes, 39 remain/));
  // Second envelope cut.
  const two = encodeBatch([env(25, 1), env(26, 2)]);
  assert.throws(() => decodeBatch(two.subarray(0, two.length - 1)), malformed(/envelope 1 announces 26 bytes, 25 remain/));
  // A huge announced length.
  const huge = new Uint8Array(4 + 25);
  new DataView(huge.buffer).setUint32(0, 0xffffffff);
  assert.throws(() => decodeBatch(huge), malformed(/announces 4294967295 bytes, 25 remain/));
});

test("length under the 25-byte minimum: 24 and 0 refused, 25 accepted", () => {
  assert.throws(() => decodeBatch(encodeBatch([env(24, 1)])), malformed(/envelope 0 is 24 bytes, under the 25-byte minimum/));
  assert.throws(() => decodeBatch(new Uint8Array(4)), malformed(/envelope 0 is 0 bytes/));
  assert.equal(decodeBatch(encodeBatch([env(25, 1)])).length, 1);
});

test("not a Uint8Array: TypeError", () => {
  assert.throws(() => decodeBatch("abc"), TypeError);
  assert.throws(() => decodeBatch(new ArrayBuffer(4)), TypeError);
});
