package envcache

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"edgerelay/fastpath/alloctest"
)

func envelope(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestPutThenAppend(t *testing.T) {
	c := New(1 << 20)
	k := Key{Epoch: 1, Dir: 'p', Seq: 7}
	env := []byte("\x01envelope bytes")
	if _, ok := c.Append(nil, k); ok {
		t.Fatal("found before put")
	}
	c.Put(k, env)
	got, ok := c.Append([]byte("x"), k)
	if !ok || string(got) != "x"+string(env) {
		t.Fatalf("Append = %q, %v", got, ok)
	}
	// The caller's buffer is not kept.
	env[0] = 0
	if got, _ := c.Append(nil, k); got[0] != 0x01 {
		t.Fatal("the cache kept the caller's slice")
	}
	for _, other := range []Key{{Epoch: 2, Dir: 'p', Seq: 7}, {Epoch: 1, Dir: 'c', Seq: 7}, {Epoch: 1, Dir: 'p', Seq: 8}} {
		if _, ok := c.Append(nil, other); ok {
			t.Errorf("%+v found: keys must differ in every field", other)
		}
	}
	if st := c.Stats(); st.Hits != 2 || st.Misses != 4 || st.Entries != 1 || st.Bytes != len(env) {
		t.Errorf("stats %+v", st)
	}
	if h, m := c.Lookups(); h != 2 || m != 4 {
		t.Errorf("lookups %d hits, %d misses", h, m)
	}
}

func TestAKeyKeepsItsFirstBytes(t *testing.T) {
	c := New(1 << 20)
	k := Key{Epoch: 1, Seq: 1}
	c.Put(k, []byte("first"))
	c.Put(k, []byte("second"))
	if got, _ := c.Append(nil, k); string(got) != "first" {
		t.Fatalf("got %q", got)
	}
	if !c.Has(k) || c.Has(Key{Epoch: 2, Seq: 1}) {
		t.Error("Has")
	}
	if eq, known := c.Equal(k, []byte("first")); !eq || !known {
		t.Error("Equal(first) false")
	}
	if eq, known := c.Equal(k, []byte("second")); eq || !known {
		t.Error("Equal(second) true")
	}
	if _, known := c.Equal(Key{Epoch: 9}, nil); known {
		t.Error("Equal of a missing key known")
	}
}

func TestSizeLimits(t *testing.T) {
	if New(shardCount*4*minAverage-1) != nil {
		t.Error("a cache too small to be useful was made")
	}
	var none *Cache
	none.Put(Key{}, []byte("x"))
	if _, ok := none.Append(nil, Key{}); ok || none.MaxEntry() != 0 || none.Stats() != (Stats{}) {
		t.Error("a nil cache holds something")
	}
	c := New(16 << 20)
	r := rand.New(rand.NewPCG(1, 2))
	atMax, over := envelope(r, c.MaxEntry()), envelope(r, c.MaxEntry()+1)
	c.Put(Key{Seq: 1}, atMax)
	c.Put(Key{Seq: 2}, over)
	if got, ok := c.Append(nil, Key{Seq: 1}); !ok || !bytes.Equal(got, atMax) {
		t.Error("an envelope of MaxEntry bytes was not kept")
	}
	if _, ok := c.Append(nil, Key{Seq: 2}); ok {
		t.Error("an envelope of MaxEntry+1 bytes was kept")
	}
	if c.MaxEntry() < 64<<10 {
		t.Errorf("16 MiB keeps envelopes up to %d bytes, less than the spec's 65,536", c.MaxEntry())
	}
}

// TestFirstInFirstOut fills one cache far past its size with envelopes of
// random sizes and checks, against a model of every put, that whatever
// the cache answers is exactly what was put, that it never holds more
// than its bytes, and that the newest envelopes are always there.
func TestFirstInFirstOut(t *testing.T) {
	const total = 256 << 10
	c := New(total)
	r := rand.New(rand.NewPCG(3, 4))
	model := map[Key][]byte{}
	var keys []Key
	for i := range 20000 {
		n := 25 + r.IntN(c.MaxEntry()-24)
		if r.IntN(4) > 0 {
			n = 25 + r.IntN(200) // mostly small, so the index fills too
		}
		k := Key{Epoch: uint64(r.IntN(8)), Dir: "pc"[r.IntN(2)], Seq: uint64(i)}
		env := envelope(r, n)
		c.Put(k, env)
		model[k] = env
		keys = append(keys, k)
		if got, ok := c.Append(nil, k); !ok || !bytes.Equal(got, env) {
			t.Fatalf("put %d (%d bytes) not read back", i, n)
		}
		for range 4 {
			old := keys[r.IntN(len(keys))]
			if got, ok := c.Append(nil, old); ok && !bytes.Equal(got, model[old]) {
				t.Fatalf("after put %d: %+v answered other bytes", i, old)
			}
		}
	}
	st := c.Stats()
	if st.Bytes > total || st.Bytes <= 0 {
		t.Errorf("holds %d bytes in a cache of %d", st.Bytes, total)
	}
	held := 0
	for _, k := range keys {
		if got, ok := c.Append(nil, k); ok {
			held++
			if !bytes.Equal(got, model[k]) {
				t.Fatalf("%+v answered other bytes", k)
			}
		}
	}
	if held != st.Entries {
		t.Errorf("%d keys answer, stats say %d entries", held, st.Entries)
	}
	// What a shard drops is its oldest: the last few puts are all held.
	for _, k := range keys[len(keys)-8:] {
		if _, ok := c.Append(nil, k); !ok {
			t.Errorf("recent %+v dropped", k)
		}
	}
}

// TestConcurrentUse runs writers and readers at once (meaningful under
// -race): every hit must be the bytes put under that key.
func TestConcurrentUse(t *testing.T) {
	c := New(64 << 10 * shardCount)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 5))
			for i := range 5000 {
				k := Key{Epoch: uint64(w), Seq: uint64(i)}
				env := make([]byte, 25+r.IntN(2000))
				for j := range env {
					env[j] = byte(uint64(w)*31 + uint64(i))
				}
				c.Put(k, env)
				back := Key{Epoch: uint64(w), Seq: uint64(r.IntN(i + 1))}
				if got, ok := c.Append(nil, back); ok {
					want := byte(back.Epoch*31 + back.Seq)
					for _, b := range got {
						if b != want {
							t.Errorf("%+v: byte %d, want %d", back, b, want)
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestAllocsPutAndAppend: once warm, keeping and reading envelopes
// allocates nothing (the ring, the index and the map are made up front).
func TestAllocsPutAndAppend(t *testing.T) {
	c := New(1 << 20)
	env := make([]byte, 1024)
	dst := make([]byte, 0, 2048)
	seq := uint64(0)
	// The warm-up goes round the ring many times, so the index has
	// dropped and reused entries before the count starts.
	count := alloctest.Measure(t, 20000, 20000, func() error {
		seq++
		k := Key{Epoch: 1, Seq: seq}
		c.Put(k, env)
		var ok bool
		if dst, ok = c.Append(dst[:0], k); !ok {
			return fmt.Errorf("put %d not held", seq)
		}
		return nil
	})
	if alloctest.RaceEnabled() {
		t.Skipf("race detector: %d mallocs in %d runs, not asserted", count.Mallocs, count.Runs)
	}
	if count.Mallocs != 0 {
		t.Fatalf("%d mallocs in %d runs of put and read, want 0", count.Mallocs, count.Runs)
	}
}

func BenchmarkPut(b *testing.B) {
	c := New(32 << 20)
	env := make([]byte, 1024)
	b.ReportAllocs()
	seq := uint64(0)
	for b.Loop() {
		seq++
		c.Put(Key{Epoch: 1, Seq: seq}, env)
	}
}

func BenchmarkAppendHit(b *testing.B) {
	c := New(32 << 20)
	env := make([]byte, 1024)
	for i := range 1000 {
		c.Put(Key{Epoch: 1, Seq: uint64(i)}, env)
	}
	dst := make([]byte, 0, 2048)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		dst, _ = c.Append(dst[:0], Key{Epoch: 1, Seq: uint64(i % 1000)})
	}
}

// TestHoldsMostOfWhatFits: with the ring full of 1 KiB envelopes, index
// collisions (a key can sit in two slots only) lose few of them.
func TestHoldsMostOfWhatFits(t *testing.T) {
	const total, size = 4 << 20, 1024
	c := New(total)
	env := make([]byte, size)
	fits := total / size
	for i := range 3 * fits {
		c.Put(Key{Epoch: 1, Seq: uint64(i)}, env)
	}
	held := 0
	for i := 2 * fits; i < 3*fits; i++ {
		if _, ok := c.Append(nil, Key{Epoch: 1, Seq: uint64(i)}); ok {
			held++
		}
	}
	t.Logf("%d of the last %d held", held, fits)
	if held < fits*9/10 {
		t.Errorf("%d of the last %d envelopes held, want at least 90%%", held, fits)
	}
}
