package mailbox

import (
	"encoding/binary"
	"errors"
	"fmt"

	"edgerelay/sdk/link"
)

// ErrBatch is wrapped by every error of DecodeBatch, and by Batch's error
// for an answer that does not parse.
var ErrBatch = errors.New("malformed batch")

// DecodeBatch splits a batch body (Content-Type application/vnd.zerobyte.batch)
// into its envelopes: each is a 4-byte big-endian length, then that many
// bytes. The envelopes share body's memory.
//
// It is strict, because a batch that does not parse exactly means the answer
// was cut or is not a batch, and guessing would hand the reader garbage: a
// length prefix or an envelope cut short is an error, and so is a length
// below link.Overhead (25), since the relay never stores such an envelope.
// An empty body is a batch of none (nothing stored above after).
func DecodeBatch(body []byte) ([][]byte, error) {
	envs, err := decodeBatch(body)
	if err != nil {
		return nil, fmt.Errorf("mailbox: %w", err)
	}
	return envs, nil
}

// decodeBatch is DecodeBatch without the package prefix on its errors, for
// Batch, which adds its own.
func decodeBatch(body []byte) ([][]byte, error) {
	var envs [][]byte
	for off := 0; off < len(body); {
		if len(body)-off < 4 {
			return nil, fmt.Errorf("%w: %d bytes at offset %d, a length prefix needs 4", ErrBatch, len(body)-off, off)
		}
		n := binary.BigEndian.Uint32(body[off:])
		off += 4
		if n < link.Overhead {
			return nil, fmt.Errorf("%w: envelope %d is %d bytes, under the %d-byte minimum", ErrBatch, len(envs), n, link.Overhead)
		}
		if uint64(n) > uint64(len(body)-off) {
			return nil, fmt.Errorf("%w: envelope %d announces %d bytes, %d remain", ErrBatch, len(envs), n, len(body)-off)
		}
		envs = append(envs, body[off:off+int(n):off+int(n)])
		off += int(n)
	}
	return envs, nil
}
