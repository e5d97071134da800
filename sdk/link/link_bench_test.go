package link_test

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"testing"

	"edgerelay/sdk/link"
)

// The benchmarks run ours beside raw AES-256-GCM in the same run: an AEAD
// from aes.NewCipher and cipher.NewGCM built once outside the loop, sealing
// and opening with the same nonce (4 zero bytes || seq) and AAD (9 bytes)
// shape. The goal is ours ≤ 1.2× raw: the envelope framing must cost next to
// nothing beside the cipher.

var benchSizes = []struct {
	name string
	n    int
}{{"256B", 256}, {"4KiB", 4096}}

func rawAEAD(b *testing.B) cipher.AEAD {
	b.Helper()
	var key [32]byte
	key[0] = 7
	block, err := aes.NewCipher(key[:])
	if err != nil {
		b.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		b.Fatal(err)
	}
	return aead
}

func BenchmarkSeal(b *testing.B) {
	for _, size := range benchSizes {
		msg := make([]byte, size.n)
		b.Run(size.name+"/ours", func(b *testing.B) {
			s := newSealer(b)
			dst := make([]byte, 0, size.n+link.Overhead)
			b.ReportAllocs()
			b.SetBytes(int64(size.n))
			var seq uint64
			for b.Loop() {
				seq++
				if _, err := s.Seal(dst[:0], seq, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/raw", func(b *testing.B) {
			aead := rawAEAD(b)
			dst := make([]byte, link.HeaderSize, size.n+link.Overhead)
			dst[0] = link.Version
			nonce := make([]byte, 12)
			b.ReportAllocs()
			b.SetBytes(int64(size.n))
			var seq uint64
			for b.Loop() {
				seq++
				binary.BigEndian.PutUint64(nonce[4:], seq)
				binary.BigEndian.PutUint64(dst[1:], seq)
				aead.Seal(dst, nonce, msg, dst)
			}
		})
	}
}

func BenchmarkOpen(b *testing.B) {
	for _, size := range benchSizes {
		msg := make([]byte, size.n)
		b.Run(size.name+"/ours", func(b *testing.B) {
			s := newSealer(b)
			env := seal(b, s, 1, string(msg))
			out := make([]byte, 0, size.n)
			b.ReportAllocs()
			b.SetBytes(int64(size.n))
			for b.Loop() {
				if _, _, err := s.Open(out[:0], env); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/raw", func(b *testing.B) {
			aead := rawAEAD(b)
			env := seal(b, newSealer(b), 1, string(msg))
			nonce := make([]byte, 12)
			out := make([]byte, 0, size.n)
			b.ReportAllocs()
			b.SetBytes(int64(size.n))
			for b.Loop() {
				binary.BigEndian.PutUint64(nonce[4:], binary.BigEndian.Uint64(env[1:link.HeaderSize]))
				if _, err := aead.Open(out[:0], nonce, env[link.HeaderSize:], env[:link.HeaderSize]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReaderAccept is Open plus the replay check, in order.
func BenchmarkReaderAccept(b *testing.B) {
	s := newSealer(b)
	const n = 1024
	envs := make([][]byte, n)
	msg := make([]byte, 256)
	for i := range envs {
		envs[i] = seal(b, s, uint64(i+1), string(msg))
	}
	out := make([]byte, 0, len(msg))
	var key [32]byte
	key[0] = 7
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	r, _ := link.NewReader(key, 0)
	i := 0
	for b.Loop() {
		if i == n {
			b.StopTimer()
			r, _ = link.NewReader(key, 0)
			i = 0
			b.StartTimer()
		}
		if _, _, err := r.Accept(out[:0], envs[i]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
