package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// rawVersion reads the version record of a closed store straight from
// Pebble (read-only): the value and whether it is there.
func rawVersion(t *testing.T, dataDir string) (uint64, bool) {
	t.Helper()
	pdb, err := pebble.Open(filepath.Join(dataDir, "pebble"), &pebble.Options{ReadOnly: true, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	v, ok, err := storedVersion(pdb)
	if err != nil {
		t.Fatal(err)
	}
	return v, ok
}

func openWith(t *testing.T, dir string, o Options) *DB {
	t.Helper()
	db, err := OpenOptions(dir, nil, o)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestVersionEmptyStoreGetsTheCurrentVersion(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	if db.Version() != Version {
		t.Fatalf("Version() = %d, want %d", db.Version(), Version)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if v, ok := rawVersion(t, dir); !ok || v != Version {
		t.Fatalf("record: %d %t", v, ok)
	}
	// A second open changes nothing and says the same.
	db = openTemp(t, dir)
	defer db.Close()
	if db.Version() != Version {
		t.Fatalf("reopen: %d", db.Version())
	}
}

// legacyStore writes a store as binaries before versions did: records, no
// version record.
func legacyStore(t *testing.T, dir string) {
	t.Helper()
	db := openWith(t, dir, Options{noVersion: true})
	if err := NewChannelClaims(db).AddKey(h("k1"), "alpha", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := rawVersion(t, dir); ok {
		t.Fatal("the legacy store has a version record")
	}
}

func TestVersionStoreWithoutRecordIsVersion1(t *testing.T) {
	dir := t.TempDir()
	legacyStore(t, dir)
	db := openTemp(t, dir)
	if db.Version() != 1 {
		t.Fatalf("Version() = %d", db.Version())
	}
	keys, err := NewChannelClaims(db).Keys()
	if err != nil || len(keys) != 1 || keys[0].Host != "alpha" {
		t.Fatalf("keys %v %v", keys, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if v, ok := rawVersion(t, dir); !ok || v != 1 {
		t.Fatalf("record: %d %t", v, ok)
	}
}

// renameStep is a test-only migration 1 -> 2: every channel key record is
// copied under 'c' 'K' and the old one deleted, the kind of rewrite a real
// step would do.
func renameStep(ran *[]uint64) migration {
	return migration{From: 1, Apply: func(r pebble.Reader, b *pebble.Batch) error {
		*ran = append(*ran, 1)
		it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte("ck"), UpperBound: []byte("cl")})
		if err != nil {
			return err
		}
		for ok := it.First(); ok; ok = it.Next() {
			nk := append([]byte("cK"), it.Key()[2:]...)
			if err := errors.Join(b.Set(nk, it.Value(), nil), b.Delete(it.Key(), nil)); err != nil {
				_ = it.Close()
				return err
			}
		}
		return it.Close()
	}}
}

func markStep(from uint64, ran *[]uint64) migration {
	return migration{From: from, Apply: func(_ pebble.Reader, b *pebble.Batch) error {
		*ran = append(*ran, from)
		return b.Set([]byte{0, 't', byte(from)}, []byte("done"), nil)
	}}
}

func TestVersionMigratesStepByStep(t *testing.T) {
	dir := t.TempDir()
	legacyStore(t, dir)
	var ran []uint64
	// Listed out of order: the table is searched by From, not walked.
	vs := &versioning{current: 3, steps: []migration{markStep(2, &ran), renameStep(&ran)}}
	db := openWith(t, dir, Options{versions: vs})
	if db.Version() != 3 || !reflect.DeepEqual(ran, []uint64{1, 2}) {
		t.Fatalf("version %d, steps run %v", db.Version(), ran)
	}
	k1 := h("k1")
	if _, err := db.Get(append([]byte("cK"), k1[:]...)); err != nil {
		t.Fatalf("step 1 -> 2 not applied: %v", err)
	}
	if _, err := db.Get(channelKeyKey(h("k1"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old record still there: %v", err)
	}
	if v, err := db.Get([]byte{0, 't', 2}); err != nil || string(v) != "done" {
		t.Fatalf("step 2 -> 3: %q %v", v, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// At the current version nothing runs again.
	ran = nil
	db = openWith(t, dir, Options{versions: vs})
	defer db.Close()
	if db.Version() != 3 || len(ran) != 0 {
		t.Fatalf("reopen: version %d, steps run %v", db.Version(), ran)
	}
}

func TestVersionFailedStepChangesNothing(t *testing.T) {
	dir := t.TempDir()
	legacyStore(t, dir)
	boom := errors.New("boom")
	vs := &versioning{current: 2, steps: []migration{{From: 1, Apply: func(_ pebble.Reader, b *pebble.Batch) error {
		if err := b.Set([]byte{0, 't', 1}, []byte("half"), nil); err != nil {
			return err
		}
		return boom
	}}}}
	if _, err := OpenOptions(dir, nil, Options{versions: vs}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "migrate store format 1 to 2") {
		t.Fatalf("open: %v", err)
	}
	db := openTemp(t, dir) // the lock was released, the store is still at 1
	defer db.Close()
	if db.Version() != 1 {
		t.Fatalf("version %d", db.Version())
	}
	if _, err := db.Get([]byte{0, 't', 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the failed step's write is there: %v", err)
	}
}

func TestVersionMissingStepIsRefused(t *testing.T) {
	dir := t.TempDir()
	legacyStore(t, dir)
	var ran []uint64
	vs := &versioning{current: 3, steps: []migration{markStep(1, &ran)}}
	_, err := OpenOptions(dir, nil, Options{versions: vs})
	if err == nil || !strings.Contains(err.Error(), "no migration from store format 2 (this binary writes 3)") {
		t.Fatalf("open: %v", err)
	}
	if v, ok := rawVersion(t, dir); !ok || v != 2 {
		t.Fatalf("the step that ran is not kept: %d %t", v, ok)
	}
}

// fileState is what a directory tree looks like from outside: every path
// with its size, mode, modification time and content digest.
func fileState(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		s := fi.Mode().String() + " " + fi.ModTime().Format(time.RFC3339Nano)
		if !d.IsDir() {
			raw, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(raw)
			s += " " + hex.EncodeToString(sum[:])
		}
		out[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVersionNewerStoreIsRefusedUntouched(t *testing.T) {
	dir := t.TempDir()
	db := openWith(t, dir, Options{versions: &versioning{current: 2}})
	if err := NewChannelClaims(db).AddKey(h("k1"), "alpha", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before := fileState(t, dir)
	// A server's options: a ballast would be written into the data dir.
	_, err := OpenOptions(dir, nil, Options{DiskReserve: 1 << 20, freeBytes: func(string) (uint64, error) { return 1 << 40, nil }})
	var newer *NewerVersionError
	if !errors.Is(err, ErrNewerVersion) || !errors.As(err, &newer) || newer.Store != 2 || newer.Known != Version {
		t.Fatalf("open: %v", err)
	}
	const want = "store format 2 is newer than this binary's 1: run a binary of that version or newer"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("message %q lacks %q", err, want)
	}
	if after := fileState(t, dir); !reflect.DeepEqual(before, after) {
		t.Fatalf("the refused open changed the data dir:\nbefore %v\nafter  %v", before, after)
	}
}

func TestVersionDamagedRecordIsRefused(t *testing.T) {
	dir := t.TempDir()
	db := openTemp(t, dir)
	b := db.NewBatch()
	if err := b.Set([]byte(versionKey), []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := db.Commit(b); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, nil); err == nil || !strings.Contains(err.Error(), "holds 3 bytes, not 8") {
		t.Fatalf("open: %v", err)
	}
}

func TestVersionKeyIsOutsideEveryServicePrefix(t *testing.T) {
	for _, service := range []byte{serviceAgent, serviceChannel, serviceGateway, serviceMailbox} {
		if versionKey[0] == service {
			t.Fatalf("version key shares service byte %q", service)
		}
	}
}

// ---- the fixture: a store written by the layout before versions ----

const fixtureDir = "testdata/store-v1"

var updateFixture = flag.Bool("update", false, "rewrite testdata/store-v1 (TestVersionFixtureOfTodaysLayout)")

// fixtureTime is the clock of every fixture record.
var fixtureTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

const fixtureMailbox = "notes/fixture-mailbox-0001"

// TestVersionFixtureOfTodaysLayout opens a copy of testdata/store-v1, a
// store written before versions existed that holds one record of every
// kind, records version 1 for it and reads every record back through the
// store's API. Regenerate it with
//
//	go test ./store/ -run TestVersionFixtureOfTodaysLayout -update
//
// only while its layout is today's (it is version 1's fixture forever).
func TestVersionFixtureOfTodaysLayout(t *testing.T) {
	if *updateFixture {
		writeFixture(t)
	}
	dir := t.TempDir()
	if err := copyDir(fixtureDir, filepath.Join(dir, "pebble")); err != nil {
		t.Fatal(err)
	}
	if _, ok := rawVersion(t, dir); ok {
		t.Fatal("the fixture has a version record")
	}
	db := openTemp(t, dir)
	defer db.Close()
	if db.Version() != 1 {
		t.Fatalf("Version() = %d", db.Version())
	}
	checkFixture(t, db)
}

// writeFixture generates the fixture with today's store code, versionless.
func writeFixture(t *testing.T) {
	dir := t.TempDir()
	db := openWith(t, dir, Options{noVersion: true})
	at := fixtureTime
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// channel: 'c' 'k', 'c' 'o', 'c' 'p'
	ch := NewChannelClaims(db)
	must(ch.AddKey(h("claim-key"), "alpha", at))
	_, err := ch.Claim(h("claim-key"), h("owner"), h("phone"), at)
	must(err)
	// mailbox: 'm' 'b', 'm' 'i', 'm' 'e', 'm' 'k', 'm' 'r'
	ml := NewEnvelopeLog(db)
	rec := MailboxRecord{Token: h("mailbox-token"), LastActive: at.UnixNano()}
	must(ml.Claim(fixtureMailbox, rec, 0, true))
	for seq := uint64(1); seq <= 3; seq++ {
		must(ml.Put(fixtureMailbox, DirP2C, seq, fixtureEnvelope(DirP2C, seq), nil, 0))
	}
	must(ml.Put(fixtureMailbox, DirC2P, 1, fixtureEnvelope(DirC2P, 1), nil, 0))
	must(ml.Prune(fixtureMailbox, DirP2C, 1))
	must(ml.SetPushRegistration(fixtureMailbox, DirC2P, []byte("sealed-registration")))
	// agent: 'a' 'a', 'a' 'c', 'a' 'k', 'a' 'i', 'a' 't'
	ag := NewAgentStore(db)
	must(ag.AddAccount("acct-1", "alice", h("client-token"), at))
	must(ag.AddPairingKey(h("pair-open"), "acct-1", at, at.Add(15*time.Minute)))
	must(ag.AddPairingKey(h("pair-used"), "acct-1", at, at.Add(15*time.Minute)))
	_, err = ag.RedeemPairingKey(h("pair-used"), "inst-1", "build-box", h("instance-token"), at)
	must(err)
	// push gateway, shared scope: 'k', 'i', 'b' (mount slot and legacy
	// slot), 't', 'd'; and a key in a mount's own scope.
	gw, err := NewPushGateway(db, PushScopeShared)
	must(err)
	must(gw.AddKey(PushKey{ID: "key-admin", Hash: h("api-key"), Label: "homeserver", Enabled: true, CreatedAt: at, Source: PushSourceAdmin}))
	_, err = gw.RegisterKey(PushKey{ID: "key-self", Hash: h("api-key-self"), Label: "self", Enabled: true, CreatedAt: at, Source: PushSourceSelf, RegisteredIP: "192.0.2.1", Mount: "fcm"})
	must(err)
	_, err = gw.RegisterKey(PushKey{ID: "key-legacy", Hash: h("api-key-legacy"), Label: "legacy", Enabled: true, CreatedAt: at, Source: PushSourceSelf, RegisteredIP: "192.0.2.2"})
	must(err)
	ticket, err := gw.Claim(h("device-token"), "key-admin", at)
	must(err)
	must(gw.Settle(ticket, true))
	for range 3 {
		_, ok, err := gw.DrawBudget(100, at)
		must(err)
		if !ok {
			t.Fatal("budget refused")
		}
	}
	must(gw.FlushBudget())
	fcm, err := NewPushGateway(db, PushScopeFCM)
	must(err)
	must(fcm.AddKey(PushKey{ID: "key-fcm", Hash: h("api-key-fcm"), Label: "fcm-only", Enabled: true, CreatedAt: at, Source: PushSourceAdmin}))
	// Into tables, so the fixture does not depend on replaying a WAL.
	must(db.Flush())
	must(db.Close())
	must(os.RemoveAll(fixtureDir))
	must(copyDir(filepath.Join(dir, "pebble"), fixtureDir))
	t.Logf("wrote %s", fixtureDir)
}

func fixtureEnvelope(dir byte, seq uint64) []byte {
	return []byte("envelope " + string(dir) + " " + string(rune('0'+seq)))
}

// checkFixture reads every record writeFixture wrote.
func checkFixture(t *testing.T, db *DB) {
	t.Helper()
	at := fixtureTime
	ch := NewChannelClaims(db)
	keys, err := ch.Keys()
	if err != nil || len(keys) != 1 || keys[0].Host != "alpha" || !keys[0].Used || !keys[0].Claimed {
		t.Fatalf("channel keys %+v %v", keys, err)
	}
	if k, err := ch.ByOwner(h("owner")); err != nil || k.Host != "alpha" {
		t.Fatalf("owner index: %+v %v", k, err)
	}
	if k, err := ch.ByPhone(h("phone")); err != nil || k.Host != "alpha" {
		t.Fatalf("phone index: %+v %v", k, err)
	}

	ml := NewEnvelopeLog(db)
	rec, err := ml.Mailbox(fixtureMailbox)
	if err != nil || rec.Token != h("mailbox-token") || rec.LastActive != at.UnixNano() {
		t.Fatalf("mailbox record %+v %v", rec, err)
	}
	for _, e := range []struct {
		dir  byte
		seq  uint64
		want bool
	}{{DirP2C, 1, false}, {DirP2C, 2, true}, {DirP2C, 3, true}, {DirC2P, 1, true}} {
		var got []byte
		ok, err := ml.Envelope(fixtureMailbox, e.dir, e.seq, func(env []byte) { got = bytes.Clone(env) })
		if err != nil || ok != e.want || ok && !bytes.Equal(got, fixtureEnvelope(e.dir, e.seq)) {
			t.Fatalf("envelope %c %d: %t %q %v", e.dir, e.seq, ok, got, err)
		}
	}
	st, err := ml.State(fixtureMailbox, DirP2C)
	if err != nil || st.Pruned != 1 || st.Count != 2 || st.First != 2 || st.Last != 3 {
		t.Fatalf("p2c state %+v %v", st, err)
	}
	if reg, err := ml.PushRegistration(fixtureMailbox, DirC2P); err != nil || string(reg) != "sealed-registration" {
		t.Fatalf("push registration %q %v", reg, err)
	}
	var idle []string
	if err := ml.IdleBefore(at.UnixNano()+1, func(name string, last int64) bool {
		idle = append(idle, name)
		return true
	}); err != nil || !reflect.DeepEqual(idle, []string{fixtureMailbox}) {
		t.Fatalf("idle index %v %v", idle, err)
	}

	ag := NewAgentStore(db)
	acct, err := ag.AccountByClientToken(h("client-token"))
	if err != nil || acct.ID != "acct-1" || acct.Name != "alice" || !acct.Created.Equal(at) {
		t.Fatalf("account %+v %v", acct, err)
	}
	pks, err := ag.PairingKeys()
	if err != nil || len(pks) != 2 {
		t.Fatalf("pairing keys %+v %v", pks, err)
	}
	used := 0
	for _, k := range pks {
		if k.Account != "acct-1" || !k.Expires.Equal(at.Add(15*time.Minute)) {
			t.Fatalf("pairing key %+v", k)
		}
		if k.Used {
			used++
		}
	}
	if used != 1 {
		t.Fatalf("pairing keys used: %d", used)
	}
	inst, err := ag.InstanceByToken(h("instance-token"))
	if err != nil || inst.ID != "inst-1" || inst.Name != "build-box" || inst.Account != "acct-1" || inst.Revoked {
		t.Fatalf("instance %+v %v", inst, err)
	}

	gw, err := NewPushGateway(db, PushScopeShared)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := gw.KeyByHash(h("api-key")); !ok || k.ID != "key-admin" || k.Label != "homeserver" || !k.Enabled {
		t.Fatalf("admin key %+v %t", k, ok)
	}
	if k, ok := gw.KeyByID("key-self"); !ok || k.RegisteredIP != "192.0.2.1" || k.Mount != "fcm" {
		t.Fatalf("self key %+v %t", k, ok)
	}
	if n := len(gw.Keys()); n != 3 {
		t.Fatalf("%d shared keys", n)
	}
	// The address slots: a second registration from the same address and
	// mount supersedes the key that holds the slot.
	old, err := gw.RegisterKey(PushKey{ID: "key-self-2", Hash: h("api-key-self-2"), Enabled: true, CreatedAt: at, Source: PushSourceSelf, RegisteredIP: "192.0.2.1", Mount: "fcm"})
	if err != nil || old == nil || old.ID != "key-self" {
		t.Fatalf("mount slot: %+v %v", old, err)
	}
	old, err = gw.RegisterKey(PushKey{ID: "key-legacy-2", Hash: h("api-key-legacy-2"), Enabled: true, CreatedAt: at, Source: PushSourceSelf, RegisteredIP: "192.0.2.2"})
	if err != nil || old == nil || old.ID != "key-legacy" {
		t.Fatalf("legacy slot: %+v %v", old, err)
	}
	c, ok, err := gw.ClaimOf(h("device-token"))
	if err != nil || !ok || c.Owner != "key-admin" || !c.Confirmed || !c.ClaimedAt.Equal(at) {
		t.Fatalf("claim %+v %t %v", c, ok, err)
	}
	if n, err := gw.BudgetUsed(at); err != nil || n != 3 {
		t.Fatalf("budget %d %v", n, err)
	}
	fcm, err := NewPushGateway(db, PushScopeFCM)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := fcm.KeyByHash(h("api-key-fcm")); !ok || k.Label != "fcm-only" {
		t.Fatalf("fcm scope key %+v %t", k, ok)
	}
}
