package mailboxjs

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
)

// pebbleSource is a single node's mailbox keyspace in a fresh data dir.
func pebbleSource(t *testing.T) *store.EnvelopeLog {
	t.Helper()
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return store.NewEnvelopeLog(db)
}

// importAll imports every mailbox of from through s, as the command does,
// stopping at the first error.
func importAll(t *testing.T, s *Store, from *store.EnvelopeLog) (mailboxes, envelopes int, err error) {
	t.Helper()
	eachErr := from.EachMailbox(func(name string, rec store.MailboxRecord) bool {
		var st ImportStats
		st, err = s.Import(clustertest.Context(t), from, name, rec)
		envelopes += st.Envelopes
		if err == nil {
			mailboxes++
		}
		return err == nil
	})
	if eachErr != nil {
		t.Fatal(eachErr)
	}
	return mailboxes, envelopes, err
}

// streamMsgs is how many messages the shard of name holds.
func streamMsgs(t *testing.T, s *Store, name string) uint64 {
	t.Helper()
	n, err := s.names(name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.streams[n.shard].Info(clustertest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestImportFromPebble: a single node's mailboxes (claims, envelopes of
// both directions with a 64 KiB one, a pruned mark, push registrations)
// move into a 3-node cluster through node 0 and read back through the
// others exactly: the claim record as stored (not refreshed, not expired),
// every envelope byte for byte, the mark refusing a put at it, the
// registrations. A second run through node 2 writes nothing (no stream
// message added, no head or claim moved). A cluster mailbox held by
// another token, also one idle for years by the import's LastActive, is
// refused with nothing overwritten, as are other bytes under a sequence;
// a registration made through the cluster stays.
func TestImportFromPebble(t *testing.T) {
	_, st := start(t)
	ctx := clustertest.Context(t)
	from := pebbleSource(t)
	// A mailbox last active an hour ago: the import keeps that time.
	active := time.Now().Add(-time.Hour).UnixNano()
	alpha, beta := "notes/import-alpha", "notes/import-beta"
	recA := store.MailboxRecord{Token: store.Hash{7}, LastActive: active}
	recB := store.MailboxRecord{Token: store.Hash{8}, LastActive: active - int64(time.Minute)}
	big := append(envelope(6, ""), bytes.Repeat([]byte{'x'}, 64<<10-25)...)
	if len(big) != 64<<10 {
		t.Fatalf("big envelope of %d bytes", len(big))
	}
	p2c := map[uint64][]byte{}
	c2p := map[uint64][]byte{}
	if err := from.Claim(alpha, recA, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := from.Claim(beta, recB, 0, false); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 6; seq++ {
		env := envelope(seq, fmt.Sprint("p", seq))
		if seq == 6 {
			env = big
		}
		p2c[seq] = env
		if err := from.Put(alpha, store.DirP2C, seq, env, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := from.Prune(alpha, store.DirP2C, 2); err != nil {
		t.Fatal(err)
	}
	delete(p2c, 1)
	delete(p2c, 2)
	for seq := uint64(1); seq <= 3; seq++ {
		c2p[seq] = envelope(seq, fmt.Sprint("c", seq))
		if err := from.Put(alpha, store.DirC2P, seq, c2p[seq], nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	sealedP := []byte("sealed under the bearer, p2c")
	if err := from.SetPushRegistration(alpha, store.DirP2C, sealedP); err != nil {
		t.Fatal(err)
	}
	sealedB := []byte("sealed under beta's bearer, c2p")
	if err := from.SetPushRegistration(beta, store.DirC2P, sealedB); err != nil {
		t.Fatal(err)
	}

	n, envs, err := importAll(t, st[0], from)
	if err != nil || n != 2 || envs != 7 {
		t.Fatalf("import: %d mailboxes, %d envelopes, %v; want 2, 7, nil", n, envs, err)
	}
	check := func(t *testing.T, s *Store) {
		t.Helper()
		for name, want := range map[string]store.MailboxRecord{alpha: recA, beta: recB} {
			if rec, err := s.Mailbox(ctx, name); err != nil || rec != want {
				t.Fatalf("claim of %s: %+v %v, want %+v", name, rec, err, want)
			}
		}
		for _, d := range []struct {
			dir          byte
			want         map[uint64][]byte
			first, count uint64
			pruned       uint64
		}{{store.DirP2C, p2c, 3, 4, 2}, {store.DirC2P, c2p, 1, 3, 0}} {
			h, err := s.State(ctx, alpha, d.dir)
			if err != nil {
				t.Fatal(err)
			}
			if h.First() != d.first || uint64(h.Count) != d.count || h.Pruned != d.pruned || h.Active != active {
				t.Fatalf("%c head: first %d count %d pruned %d active %d, want %d %d %d %d", d.dir, h.First(), h.Count, h.Pruned, h.Active, d.first, d.count, d.pruned, active)
			}
			for seq, want := range d.want {
				got, ok, err := s.Envelope(ctx, alpha, d.dir, seq)
				if err != nil || !ok || !bytes.Equal(got, want) {
					t.Fatalf("%c envelope %d: %d bytes, %v %v; want the stored %d", d.dir, seq, len(got), ok, err, len(want))
				}
			}
		}
		if got, err := s.PushRegistration(ctx, alpha, store.DirP2C); err != nil || !bytes.Equal(got, sealedP) {
			t.Fatalf("p2c registration of alpha: %q %v", got, err)
		}
		if _, err := s.PushRegistration(ctx, alpha, store.DirC2P); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("c2p registration of alpha: %v, want none", err)
		}
		if got, err := s.PushRegistration(ctx, beta, store.DirC2P); err != nil || !bytes.Equal(got, sealedB) {
			t.Fatalf("c2p registration of beta: %q %v", got, err)
		}
	}
	t.Run("ReadsBackThroughEveryNode", func(t *testing.T) {
		for _, s := range st {
			check(t, s)
		}
		r, err := st[1].Put(ctx, alpha, store.DirP2C, 2, p2cOld(2), noLimits, time.Now().UnixNano())
		if err != nil || r.Outcome != Pruned {
			t.Fatalf("put at the imported mark: %d %v, want Pruned", r.Outcome, err)
		}
		if o, err := st[2].Claim(ctx, alpha, store.Hash{9}, time.Now().UnixNano(), time.Hour, idle); err != nil || o != ClaimTaken {
			t.Fatalf("another token's claim of the imported mailbox: %d %v, want taken", o, err)
		}
	})

	t.Run("SecondRunWritesNothing", func(t *testing.T) {
		msgs := streamMsgs(t, st[2], alpha) + streamMsgs(t, st[2], beta)
		heads := fmt.Sprint(headRev(t, st[2], alpha, 'p'), headRev(t, st[2], alpha, 'c'))
		n, envs, err := importAll(t, st[2], from)
		if err != nil || n != 2 || envs != 7 {
			t.Fatalf("second import: %d mailboxes, %d envelopes, %v; want 2, 7, nil", n, envs, err)
		}
		if got := streamMsgs(t, st[2], alpha) + streamMsgs(t, st[2], beta); got != msgs {
			t.Fatalf("the second import changed the shards' messages from %d to %d", msgs, got)
		}
		if got := fmt.Sprint(headRev(t, st[1], alpha, 'p'), headRev(t, st[1], alpha, 'c')); got != heads {
			t.Fatalf("the second import moved the heads from %s to %s", heads, got)
		}
		check(t, st[1])
	})

	t.Run("AnotherTokensMailboxIsLeft", func(t *testing.T) {
		// The cluster's gamma is another token's, last active in 2020:
		// Claim at the single node's LastActive would call it expired and
		// take it over; the import must not.
		gamma := "notes/import-gamma"
		old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		if o, err := st[0].Claim(ctx, gamma, store.Hash{10}, old, time.Hour, idle); err != nil || o != ClaimCreated {
			t.Fatal(o, err)
		}
		theirs := envelope(1, "theirs")
		if r, err := st[0].Put(ctx, gamma, 'p', 1, theirs, noLimits, old); err != nil || r.Outcome != Created {
			t.Fatal(r, err)
		}
		before := streamMsgs(t, st[1], gamma)
		src := pebbleSource(t)
		if err := src.Claim(gamma, store.MailboxRecord{Token: store.Hash{11}, LastActive: time.Now().UnixNano()}, 0, false); err != nil {
			t.Fatal(err)
		}
		if err := src.Put(gamma, 'p', 1, envelope(1, "mine"), nil, 0); err != nil {
			t.Fatal(err)
		}
		_, _, err := importAll(t, st[1], src)
		if !errors.Is(err, ErrImportConflict) || !bytes.Contains([]byte(err.Error()), []byte(gamma)) {
			t.Fatalf("import over another token's mailbox: %v, want ErrImportConflict naming %s", err, gamma)
		}
		if rec, err := st[2].Mailbox(ctx, gamma); err != nil || rec.Token != (store.Hash{10}) || rec.LastActive != old {
			t.Fatalf("the cluster's claim after the refused import: %+v %v", rec, err)
		}
		if got, ok, err := st[2].Envelope(ctx, gamma, 'p', 1); err != nil || !ok || !bytes.Equal(got, theirs) {
			t.Fatalf("the cluster's envelope after the refused import: %q %v %v", got, ok, err)
		}
		if got := streamMsgs(t, st[2], gamma); got != before {
			t.Fatalf("the refused import wrote: %d messages, %d before", got, before)
		}
	})

	t.Run("OtherBytesUnderASequenceAreRefused", func(t *testing.T) {
		delta := "notes/import-delta"
		rec := store.MailboxRecord{Token: store.Hash{12}, LastActive: time.Now().UnixNano()}
		src := pebbleSource(t)
		if err := src.Claim(delta, rec, 0, false); err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= 2; seq++ {
			if err := src.Put(delta, 'c', seq, envelope(seq, "single"), nil, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := src.SetPushRegistration(delta, 'c', []byte("single's registration")); err != nil {
			t.Fatal(err)
		}
		// The same bearer claimed it through the cluster, wrote envelope 2
		// with other bytes and registered another device.
		if o, err := st[0].Claim(ctx, delta, rec.Token, time.Now().UnixNano(), time.Hour, idle); err != nil || o != ClaimCreated {
			t.Fatal(o, err)
		}
		clusters := envelope(2, "cluster")
		mustPut(t, st[0], delta, 'c', 2, clusters, Created)
		if err := st[0].SetPushRegistration(ctx, delta, 'c', []byte("cluster's registration")); err != nil {
			t.Fatal(err)
		}
		_, _, err := importAll(t, st[2], src)
		if !errors.Is(err, ErrImportConflict) || !bytes.Contains([]byte(err.Error()), []byte(delta+"/c2p: envelope 2")) {
			t.Fatalf("import of other bytes under c2p/2: %v, want ErrImportConflict naming it", err)
		}
		if got, _, _ := st[1].Envelope(ctx, delta, 'c', 2); !bytes.Equal(got, clusters) {
			t.Fatalf("c2p/2 after the refused import: %q", got)
		}
		// The envelope before it went in (ascending), the registration
		// was not reached; an import without the conflict leaves the
		// cluster's newer registration.
		if got, _, _ := st[1].Envelope(ctx, delta, 'c', 1); !bytes.Equal(got, envelope(1, "single")) {
			t.Fatalf("c2p/1 after the refused import: %q", got)
		}
		if err := st[1].importRegistration(ctx, src, mustNames(t, st[1], delta), 'c'); err != nil {
			t.Fatal(err)
		}
		if got, _ := st[2].PushRegistration(ctx, delta, 'c'); string(got) != "cluster's registration" {
			t.Fatalf("registration after the import: %q, want the cluster's", got)
		}
	})
}

// TestImportEdges: a direction with holes in its sequences, one with one
// envelope past the envelope bucket's burst written at one instant (the
// import charges no bucket), a direction pruned empty (its mark holds in
// the cluster), and a direction written through the cluster since, whose
// later activity the import keeps.
func TestImportEdges(t *testing.T) {
	_, st := start(t)
	ctx := clustertest.Context(t)
	from := pebbleSource(t)
	name := "notes/import-edges"
	active := time.Now().Add(-time.Minute).UnixNano()
	rec := store.MailboxRecord{Token: store.Hash{21}, LastActive: active}
	if err := from.Claim(name, rec, 0, false); err != nil {
		t.Fatal(err)
	}
	// p2c: 121 envelopes, the spec's burst of 120 and one more, with holes
	// (every tenth sequence missing).
	burst := store.DefaultMailboxLimits().EnvelopeBurst
	var seqs []uint64
	for seq := uint64(1); len(seqs) < burst+1; seq++ {
		if seq%10 == 0 {
			continue
		}
		seqs = append(seqs, seq)
		if err := from.Put(name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), nil, 0); err != nil { // scanAll checks these bytes
			t.Fatal(err)
		}
	}
	// c2p: pruned empty.
	for seq := uint64(1); seq <= 2; seq++ {
		if err := from.Put(name, 'c', seq, envelope(seq, "gone"), nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := from.Prune(name, 'c', 2); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for round := range 2 {
		n, envs, err := importAll(t, st[round], from)
		if err != nil || n != 1 || envs != burst+1 {
			t.Fatalf("import round %d: %d mailboxes, %d envelopes, %v; want 1, %d, nil", round, n, envs, err, burst+1)
		}
		if round == 0 {
			t.Logf("first import of %d envelopes: %v", envs, time.Since(began))
		}
		h, err := st[2].State(ctx, name, 'p')
		if err != nil || h.Count != burst+1 || h.First() != 1 || h.Last() != seqs[len(seqs)-1] || h.Has(10) || !h.Has(11) {
			t.Fatalf("round %d, p2c head: count %d first %d last %d, has 10 %v, 11 %v, %v; want %d 1 %d false true", round, h.Count, h.First(), h.Last(), h.Has(10), h.Has(11), err, burst+1, seqs[len(seqs)-1])
		}
		got := scanAll(t, st[1], name, 'p', 0)
		if fmt.Sprint(got) != fmt.Sprint(seqs) {
			t.Fatalf("round %d, p2c scan: %v, want %v", round, got, seqs)
		}
		h, err = st[1].State(ctx, name, 'c')
		if err != nil || h.Count != 0 || h.Pruned != 2 {
			t.Fatalf("round %d, c2p head: count %d pruned %d %v, want 0 and 2", round, h.Count, h.Pruned, err)
		}
	}
	mustPut(t, st[0], name, 'c', 2, envelope(2, "gone"), Pruned)
	// Written through the cluster after the import: the next import of an
	// envelope added on the single node (an import run again after the
	// devices moved) does not move the direction's activity back.
	later := time.Now().UnixNano()
	if r, err := st[0].Put(ctx, name, 'c', 3, envelope(3, "cluster"), noLimits, later); err != nil || r.Outcome != Created {
		t.Fatal(r, err)
	}
	if err := from.Put(name, 'c', 4, envelope(4, "single"), nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := importAll(t, st[1], from); err != nil {
		t.Fatal(err)
	}
	if h, err := st[2].State(ctx, name, 'c'); err != nil || h.Count != 2 || h.Active != later {
		t.Fatalf("c2p head after a cluster write and an import: count %d active %d %v, want 2 and %d", h.Count, h.Active, err, later)
	}
}

// p2cOld is an envelope of seq that the single node pruned.
func p2cOld(seq uint64) []byte { return envelope(seq, fmt.Sprint("p", seq)) }

func headRev(t *testing.T, s *Store, name string, dir byte) uint64 {
	t.Helper()
	h, err := s.State(clustertest.Context(t), name, dir)
	if err != nil {
		t.Fatal(err)
	}
	return h.Rev
}

func mustNames(t *testing.T, s *Store, name string) names {
	t.Helper()
	n, err := s.names(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
