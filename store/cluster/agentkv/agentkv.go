// Package agentkv keeps the agent relay's accounts, client tokens, pairing
// keys and instances in the cluster's shared JetStream KV, so that every
// node authenticates, pairs and revokes alike (store.AgentRecords).
//
// Bucket er_agent_keys; names carry hex only (ids are relay-minted but
// hex-encoded all the same, since an operator's command names them):
//
//	acct.<hex account id>        account record (JSON): name, created, client token hash
//	name.<sha256 account name>   reservation of the name -> account id
//	client.<sha256 client token> hint -> account id
//	pair.<sha256 pairing key>    pairing key record (JSON): account, expiry, used, instance
//	inst.<hex instance id>       instance record (JSON): account, name, token hash, revoked
//	itok.<sha256 instance token> hint -> instance id
//
// KV has no multi-key transaction, so records are the truth and the other
// keys hints checked against them: a token counts only when the record its
// hint names holds that token's hash (and, for an instance, is not
// revoked). Hints are written before their record, so a crash between the
// two leaves a hint that reaches nothing.
//
//   - A pairing key is spent by one compare-and-set of its record from
//     unused to used, naming the instance: of any number of redemptions on
//     any nodes exactly one wins, and only the winner then writes the
//     instance's token hint and record. If those writes fail the key is
//     given back (compare-and-set to unused again); a node that crashes
//     right after the spend leaves the key used with no instance: the
//     runtime's retry is answered "used" and the operator mints another.
//     One pairing key never makes two instances.
//   - An account name is reserved by create-if-absent before the record:
//     of two nodes adding one name, one wins. A reservation naming no
//     account is an add in flight for staleAfter, then stale (a crash).
//   - A revocation is a compare-and-set of the instance record; every read
//     goes to the stream leader, so the token is refused on every node from
//     the moment RevokeInstance returns, and WatchRevoked tells every node,
//     so that the one holding the link or clients closes them.
//
// Import* move a single node's records in.
//
// Every NATS failure comes back wrapping store.ErrUnavailable (503 with
// Retry-After); a write is refused at once while the node's readiness says
// the shared store cannot take writes.
package agentkv

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Bucket is the KV bucket of the agent relay's records.
const Bucket = "er_agent_keys"

// staleAfter is how long a name reservation naming no account counts as an
// add in flight (an add takes at most one 5 s operation timeout); older, it
// was left by a crash. Its age is the stream leader's clock against this
// node's: nodes' clocks must agree to well within this.
const staleAfter = 30 * time.Second

// pairingRetention is how long a used or expired pairing key's record is
// kept after its expiry (as in the Pebble store), so a retry says why.
const pairingRetention = 24 * time.Hour

// pruneEvery is how often at most a node prunes spent and expired pairing
// keys: records live a day past their expiry, so ten minutes more is noise.
const pruneEvery = 10 * time.Minute

// Store is the agent relay's records shared by every node of a cluster. It
// implements store.AgentRecords.
type Store struct {
	c      *cluster.Cluster
	kv     jetstream.KeyValue
	stream jetstream.Stream
	// staleAfter is the constant staleAfter; tests shorten it.
	staleAfter time.Duration
	// lastPrune is the time (unix ns, the callers' clock) of this node's
	// last pruning of pairing keys (see AddPairingKey).
	lastPrune atomic.Int64
}

var _ store.AgentRecords = (*Store)(nil)

// New binds (creating it the first time) the agent records' bucket.
func New(ctx context.Context, c *cluster.Cluster) (*Store, error) {
	kv, err := c.Bucket(ctx, cluster.BucketConfig{Name: Bucket})
	if err != nil {
		return nil, fmt.Errorf("agentkv: %w", err)
	}
	st, err := c.Stream(ctx, Bucket)
	if err != nil {
		return nil, fmt.Errorf("agentkv: %w", cluster.Fail("bind stream of "+Bucket, err))
	}
	return &Store{c: c, kv: kv, stream: st, staleAfter: staleAfter}, nil
}

// The JSON records (the fields the Pebble store keeps).
type accountRecord struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Client  []byte    `json:"client"`
}

type pairingRecord struct {
	Account  string    `json:"account"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
	Used     bool      `json:"used"`
	Instance string    `json:"instance,omitempty"`
}

type instanceRecord struct {
	Account string    `json:"account"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Token   []byte    `json:"token"`
	Revoked bool      `json:"revoked,omitempty"`
}

func digest(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func accountKey(id string) string      { return "acct." + hex.EncodeToString([]byte(id)) }
func nameKey(name string) string       { return "name." + digest(name) }
func clientKey(h store.Hash) string    { return "client." + hex.EncodeToString(h[:]) }
func pairingKey(h store.Hash) string   { return "pair." + hex.EncodeToString(h[:]) }
func instanceKey(id string) string     { return "inst." + hex.EncodeToString([]byte(id)) }
func instTokenKey(h store.Hash) string { return "itok." + hex.EncodeToString(h[:]) }

// maxID bounds the ids a key is built from: the relay mints short ones, and
// an operator's command may name anything, which must read as unknown.
const maxID = 128

func validID(id string) bool { return id != "" && len(id) <= maxID }

func toHash(b []byte) (h store.Hash) {
	copy(h[:], b)
	return h
}

func same(a []byte, h store.Hash) bool { return subtle.ConstantTimeCompare(a, h[:]) == 1 }

// getJSON reads the record at key into v: false when there is none.
func (s *Store) getJSON(ctx context.Context, key string, v any) (bool, uint64, error) {
	e, err := cluster.Get(ctx, s.kv, key)
	if err != nil || e == nil {
		return false, 0, err
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return false, 0, fmt.Errorf("agentkv: record %s: %w", key, err)
	}
	return true, e.Revision(), nil
}

func marshal(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("agentkv: encode record: %w", err)
	}
	return raw, nil
}

// list returns the ids (hex-decoded name suffixes) of every key under
// prefix with a value, from the stream leader's subject list, so a record
// written through any node a moment ago is listed.
func (s *Store) list(ctx context.Context, prefix string) ([]string, error) {
	subjPrefix := "$KV." + Bucket + "." + prefix
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(subjPrefix+">"))
	if err != nil {
		return nil, cluster.Fail("list "+prefix, err)
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		id, err := hex.DecodeString(strings.TrimPrefix(subj, subjPrefix))
		if err == nil {
			out = append(out, string(id))
		}
	}
	return out, nil
}

// AddAccount stores a new account with the hash of its client token;
// account names are unique across the cluster.
func (s *Store) AddAccount(id, name string, client store.Hash, now time.Time) error {
	if err := s.c.Writable("add account"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	nameRev, err := s.kv.Create(ctx, nameKey(name), []byte(id))
	if err != nil && !cluster.Conflict(err) {
		return cluster.Fail("reserve account name", err)
	}
	if err != nil {
		if nameRev, err = s.takeName(ctx, id, name); err != nil {
			return err
		}
	}
	undo := func() { _ = cluster.Delete(ctx, s.kv, nameKey(name), nameRev) }
	clientRev, err := s.takeClientHint(ctx, id, client)
	if err != nil {
		undo()
		return err
	}
	raw, err := marshal(accountRecord{Name: name, Created: now.UTC(), Client: client[:]})
	if err != nil {
		undo()
		return err
	}
	if _, err := s.kv.Create(ctx, accountKey(id), raw); err != nil {
		_ = cluster.Delete(ctx, s.kv, clientKey(client), clientRev)
		undo()
		if cluster.Conflict(err) {
			return fmt.Errorf("store: account id %q already exists", id)
		}
		return cluster.Fail("add account", err)
	}
	return nil
}

// takeName handles an existing reservation of name: ErrAccountExists while
// it names that account (or an add in flight), else it takes the stale
// reservation over and returns its revision.
func (s *Store) takeName(ctx context.Context, id, name string) (uint64, error) {
	exists := fmt.Errorf("%w: %q", store.ErrAccountExists, name)
	e, err := cluster.Get(ctx, s.kv, nameKey(name))
	if err != nil {
		return 0, err
	}
	if e == nil {
		return 0, exists // changed under us: another add or a crash repair races
	}
	holder := string(e.Value())
	var rec accountRecord
	found, _, err := s.getJSON(ctx, accountKey(holder), &rec)
	switch {
	case err != nil:
		return 0, err
	case found && rec.Name == name:
		return 0, exists
	case !found && holder == id:
		return e.Revision(), nil // our own add, crashed before its record
	case !found && time.Since(e.Created()) < s.staleAfter:
		return 0, exists
	}
	rev, err := s.kv.Update(ctx, nameKey(name), []byte(id), e.Revision())
	if cluster.Conflict(err) {
		return 0, exists
	}
	if err != nil {
		return 0, cluster.Fail("reserve account name", err)
	}
	return rev, nil
}

// takeClientHint points the client token's hint at account id, refusing a
// token another account holds.
func (s *Store) takeClientHint(ctx context.Context, id string, client store.Hash) (uint64, error) {
	inUse := errors.New("store: client token already stored")
	rev, err := s.kv.Create(ctx, clientKey(client), []byte(id))
	if err == nil {
		return rev, nil
	}
	if !cluster.Conflict(err) {
		return 0, cluster.Fail("client token hint", err)
	}
	e, err := cluster.Get(ctx, s.kv, clientKey(client))
	if err != nil {
		return 0, err
	}
	if e == nil {
		return 0, inUse
	}
	if _, err := s.accountByClient(ctx, e, client); err == nil {
		return 0, inUse
	} else if !errors.Is(err, store.ErrUnknownToken) {
		return 0, err
	}
	rev, err = s.kv.Update(ctx, clientKey(client), []byte(id), e.Revision())
	if cluster.Conflict(err) {
		return 0, inUse
	}
	if err != nil {
		return 0, cluster.Fail("client token hint", err)
	}
	return rev, nil
}

// Accounts lists every account, ordered by name.
func (s *Store) Accounts() ([]store.AgentAccount, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	ids, err := s.list(ctx, "acct.")
	if err != nil {
		return nil, err
	}
	all := make([]store.AgentAccount, len(ids))
	err = cluster.Each(len(ids), func(i int) error {
		a, err := s.account(ctx, ids[i])
		if errors.Is(err, store.ErrUnknownAccount) {
			return nil // a deleted record's marker
		}
		all[i] = a
		return err
	})
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, a := range all {
		if a.ID != "" {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Account returns the account with id, or ErrUnknownAccount.
func (s *Store) Account(id string) (store.AgentAccount, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	return s.account(ctx, id)
}

func (s *Store) account(ctx context.Context, id string) (store.AgentAccount, error) {
	var rec accountRecord
	if !validID(id) {
		return store.AgentAccount{}, fmt.Errorf("%w: %q", store.ErrUnknownAccount, id)
	}
	found, _, err := s.getJSON(ctx, accountKey(id), &rec)
	if err != nil {
		return store.AgentAccount{}, err
	}
	if !found {
		return store.AgentAccount{}, fmt.Errorf("%w: %q", store.ErrUnknownAccount, id)
	}
	return store.AgentAccount{ID: id, Name: rec.Name, Created: rec.Created, ClientToken: toHash(rec.Client)}, nil
}

// AccountByName returns the account called name, or ErrUnknownAccount.
func (s *Store) AccountByName(name string) (store.AgentAccount, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	unknown := fmt.Errorf("%w: %q", store.ErrUnknownAccount, name)
	e, err := cluster.Get(ctx, s.kv, nameKey(name))
	if err != nil {
		return store.AgentAccount{}, err
	}
	if e == nil {
		return store.AgentAccount{}, unknown
	}
	a, err := s.account(ctx, string(e.Value()))
	if errors.Is(err, store.ErrUnknownAccount) || (err == nil && a.Name != name) {
		return store.AgentAccount{}, unknown
	}
	return a, err
}

// AccountByClientToken finds the account whose client token hashes to h,
// or ErrUnknownToken.
func (s *Store) AccountByClientToken(h store.Hash) (store.AgentAccount, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	e, err := cluster.Get(ctx, s.kv, clientKey(h))
	if err != nil {
		return store.AgentAccount{}, err
	}
	if e == nil {
		return store.AgentAccount{}, store.ErrUnknownToken
	}
	return s.accountByClient(ctx, e, h)
}

// accountByClient follows a client token hint to its account and checks the
// account holds that token.
func (s *Store) accountByClient(ctx context.Context, e jetstream.KeyValueEntry, h store.Hash) (store.AgentAccount, error) {
	a, err := s.account(ctx, string(e.Value()))
	if errors.Is(err, store.ErrUnknownAccount) {
		return store.AgentAccount{}, store.ErrUnknownToken
	}
	if err != nil {
		return store.AgentAccount{}, err
	}
	if !same(a.ClientToken[:], h) {
		return store.AgentAccount{}, store.ErrUnknownToken
	}
	return a, nil
}

// AddPairingKey stores a pairing key hash for account, valid until expires,
// then prunes the records of keys that expired more than a day ago, so the
// bucket stays bounded however many keys an operator mints. Pruning reads
// every pairing record (one round trip each), so a node prunes at most once
// per pruneEvery, and best effort: the next one prunes what it could not.
func (s *Store) AddPairingKey(h store.Hash, account string, now, expires time.Time) error {
	if err := s.c.Writable("add pairing key"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	if _, err := s.account(ctx, account); err != nil {
		return err
	}
	raw, err := marshal(pairingRecord{Account: account, Created: now.UTC(), Expires: expires.UTC()})
	if err != nil {
		return err
	}
	if _, err := s.kv.Create(ctx, pairingKey(h), raw); err != nil {
		if cluster.Conflict(err) {
			return errors.New("store: pairing key already stored")
		}
		return cluster.Fail("add pairing key", err)
	}
	if last := s.lastPrune.Load(); now.UnixNano()-last >= int64(pruneEvery) && s.lastPrune.CompareAndSwap(last, now.UnixNano()) {
		s.prune(ctx, now)
	}
	return nil
}

func (s *Store) prune(ctx context.Context, now time.Time) {
	subjPrefix := "$KV." + Bucket + ".pair."
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(subjPrefix+">"))
	if err != nil {
		return
	}
	for subj := range info.State.Subjects {
		key := strings.TrimPrefix(subj, "$KV."+Bucket+".")
		var rec pairingRecord
		found, _, err := s.getJSON(ctx, key, &rec)
		if err == nil && found && now.Sub(rec.Expires) > pairingRetention {
			// Purged from the stream rather than deleted, so no delete
			// marker is left behind for every key ever minted. Nothing
			// writes a key a day past its expiry (a redemption is refused
			// before it writes), so no compare-and-set is needed.
			_ = s.stream.Purge(ctx, jetstream.WithPurgeSubject(subj))
		}
	}
}

// RedeemPairingKey spends the pairing key h at most once across the cluster
// and creates the instance id (see the package comment for the order).
func (s *Store) RedeemPairingKey(h store.Hash, id, name string, token store.Hash, now time.Time) (store.AgentInstance, error) {
	if err := s.c.Writable("redeem pairing key"); err != nil {
		return store.AgentInstance{}, err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	check := func(rec *pairingRecord, found bool) error {
		switch {
		case !found:
			return store.ErrPairingUnknown
		case rec.Used:
			return store.ErrPairingUsed
		case !now.Before(rec.Expires):
			return store.ErrPairingExpired
		}
		return nil
	}
	var rec pairingRecord
	found, _, err := s.getJSON(ctx, pairingKey(h), &rec)
	if err != nil {
		return store.AgentInstance{}, err
	}
	if err := check(&rec, found); err != nil {
		return store.AgentInstance{}, err
	}
	if _, err := s.account(ctx, rec.Account); errors.Is(err, store.ErrUnknownAccount) {
		return store.AgentInstance{}, store.ErrPairingUnknown
	} else if err != nil {
		return store.AgentInstance{}, err
	}
	if e, err := cluster.Get(ctx, s.kv, instanceKey(id)); err != nil {
		return store.AgentInstance{}, err
	} else if e != nil {
		return store.AgentInstance{}, fmt.Errorf("%w: %q", store.ErrInstanceExists, id)
	}
	// The spend: the one write that decides.
	var unused []byte
	spent, err := cluster.Update(ctx, s.kv, pairingKey(h), func(cur []byte, _ uint64) ([]byte, error) {
		var rec pairingRecord
		if cur != nil {
			if err := json.Unmarshal(cur, &rec); err != nil {
				return nil, fmt.Errorf("agentkv: pairing record: %w", err)
			}
		}
		if err := check(&rec, cur != nil); err != nil {
			return nil, err
		}
		unused = cur
		rec.Used, rec.Instance = true, id
		return marshal(rec)
	})
	if err != nil {
		return store.AgentInstance{}, err
	}
	inst := store.AgentInstance{ID: id, Account: rec.Account, Name: name, Created: now.UTC(), Token: token}
	if err := s.createInstance(ctx, inst); err != nil {
		// Give the key back, so that the runtime's retry can pair.
		_, _ = s.kv.Update(ctx, pairingKey(h), unused, spent)
		return store.AgentInstance{}, err
	}
	return inst, nil
}

// createInstance writes the token hint, then the record.
func (s *Store) createInstance(ctx context.Context, inst store.AgentInstance) error {
	raw, err := marshal(instanceRecord{Account: inst.Account, Name: inst.Name, Created: inst.Created, Token: inst.Token[:]})
	if err != nil {
		return err
	}
	hintRev, err := s.kv.Create(ctx, instTokenKey(inst.Token), []byte(inst.ID))
	if err != nil {
		if cluster.Conflict(err) { // the relay mints 32 random bytes: never in practice
			return errors.New("store: instance token already stored")
		}
		return cluster.Fail("instance token hint", err)
	}
	if _, err := s.kv.Create(ctx, instanceKey(inst.ID), raw); err != nil {
		_ = cluster.Delete(ctx, s.kv, instTokenKey(inst.Token), hintRev)
		if cluster.Conflict(err) {
			return fmt.Errorf("%w: %q", store.ErrInstanceExists, inst.ID)
		}
		return cluster.Fail("add instance", err)
	}
	return nil
}

// Instance returns the instance with id (revoked or not), or
// ErrUnknownInstance.
func (s *Store) Instance(id string) (store.AgentInstance, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	return s.instance(ctx, id)
}

func (s *Store) instance(ctx context.Context, id string) (store.AgentInstance, error) {
	var rec instanceRecord
	if !validID(id) {
		return store.AgentInstance{}, fmt.Errorf("%w: %q", store.ErrUnknownInstance, id)
	}
	found, _, err := s.getJSON(ctx, instanceKey(id), &rec)
	if err != nil {
		return store.AgentInstance{}, err
	}
	if !found {
		return store.AgentInstance{}, fmt.Errorf("%w: %q", store.ErrUnknownInstance, id)
	}
	return store.AgentInstance{ID: id, Account: rec.Account, Name: rec.Name, Created: rec.Created,
		Token: toHash(rec.Token), Revoked: rec.Revoked}, nil
}

// InstanceByToken finds the live (not revoked) instance whose token hashes
// to h, or ErrUnknownToken.
func (s *Store) InstanceByToken(h store.Hash) (store.AgentInstance, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	e, err := cluster.Get(ctx, s.kv, instTokenKey(h))
	if err != nil {
		return store.AgentInstance{}, err
	}
	if e == nil {
		return store.AgentInstance{}, store.ErrUnknownToken
	}
	inst, err := s.instance(ctx, string(e.Value()))
	if errors.Is(err, store.ErrUnknownInstance) {
		return store.AgentInstance{}, store.ErrUnknownToken
	}
	if err != nil {
		return store.AgentInstance{}, err
	}
	if inst.Revoked || !same(inst.Token[:], h) {
		return store.AgentInstance{}, store.ErrUnknownToken
	}
	return inst, nil
}

// Instances lists every instance, revoked ones included, ordered by
// account, then name, then id.
func (s *Store) Instances() ([]store.AgentInstance, error) {
	ctx, cancel := cluster.Context()
	defer cancel()
	ids, err := s.list(ctx, "inst.")
	if err != nil {
		return nil, err
	}
	all := make([]store.AgentInstance, len(ids))
	err = cluster.Each(len(ids), func(i int) error {
		inst, err := s.instance(ctx, ids[i])
		if errors.Is(err, store.ErrUnknownInstance) {
			return nil // a deleted record's marker
		}
		all[i] = inst
		return err
	})
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, inst := range all {
		if inst.ID != "" {
			out = append(out, inst)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Account != b.Account {
			return a.Account < b.Account
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.ID < b.ID
	})
	return out, nil
}

// RevokeInstance marks the instance revoked (its token is refused on every
// node from the return on), then drops its token hint. Revoking a revoked
// instance is not an error.
func (s *Store) RevokeInstance(id string) (store.AgentInstance, error) {
	if err := s.c.Writable("revoke instance"); err != nil {
		return store.AgentInstance{}, err
	}
	if !validID(id) {
		return store.AgentInstance{}, fmt.Errorf("%w: %q", store.ErrUnknownInstance, id)
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	var inst store.AgentInstance
	_, err := cluster.Update(ctx, s.kv, instanceKey(id), func(cur []byte, _ uint64) ([]byte, error) {
		if cur == nil {
			return nil, fmt.Errorf("%w: %q", store.ErrUnknownInstance, id)
		}
		var rec instanceRecord
		if err := json.Unmarshal(cur, &rec); err != nil {
			return nil, fmt.Errorf("agentkv: instance record: %w", err)
		}
		inst = store.AgentInstance{ID: id, Account: rec.Account, Name: rec.Name, Created: rec.Created,
			Token: toHash(rec.Token), Revoked: true}
		if rec.Revoked {
			return nil, cluster.ErrSkip
		}
		rec.Revoked = true
		return marshal(rec)
	})
	if err != nil {
		return store.AgentInstance{}, err
	}
	if e, err := cluster.Get(ctx, s.kv, instTokenKey(inst.Token)); err == nil && e != nil && string(e.Value()) == id {
		_ = cluster.Delete(ctx, s.kv, instTokenKey(inst.Token), e.Revision())
	}
	return inst, nil
}

// ErrImportConflict is returned by an import of a record the cluster already
// holds in another state.
var ErrImportConflict = errors.New("agentkv: the cluster holds this record in another state")

// The imports write one record as the Pebble store lists it (AgentStore's
// Accounts, Instances, PairingKeys) into the cluster, for moving a single
// node's store into the cluster: accounts first, then instances, then
// pairing keys. Each writes in the order the live operation does (hints,
// then the record), so an import cut short leaves nothing that works
// halfway, and each is idempotent: a record already imported in the same
// state is left as it is; one the cluster holds in another state is
// ErrImportConflict.

// ImportAccount imports one account.
func (s *Store) ImportAccount(a store.AgentAccount) error {
	if err := s.c.Writable("import account"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	if !validID(a.ID) {
		return fmt.Errorf("agentkv: import account %q: id of 1 to %d bytes", a.ID, maxID)
	}
	if _, err := s.kv.Create(ctx, nameKey(a.Name), []byte(a.ID)); err != nil {
		if !cluster.Conflict(err) {
			return cluster.Fail("import: reserve account name", err)
		}
		if e, err := cluster.Get(ctx, s.kv, nameKey(a.Name)); err != nil {
			return err
		} else if string(cluster.Value(e)) != a.ID {
			if _, err := s.takeName(ctx, a.ID, a.Name); err != nil {
				return err
			}
		}
	}
	if e, err := cluster.Get(ctx, s.kv, clientKey(a.ClientToken)); err != nil {
		return err
	} else if string(cluster.Value(e)) != a.ID {
		if _, err := s.takeClientHint(ctx, a.ID, a.ClientToken); err != nil {
			return fmt.Errorf("import account %q: %w", a.Name, err)
		}
	}
	return s.importRecord(ctx, accountKey(a.ID), accountRecord{Name: a.Name, Created: a.Created.UTC(), Client: a.ClientToken[:]})
}

// ImportInstance imports one instance (its account imported first); a
// revoked one gets no token hint.
func (s *Store) ImportInstance(in store.AgentInstance) error {
	if err := s.c.Writable("import instance"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	if !validID(in.ID) {
		return fmt.Errorf("agentkv: import instance %q: id of 1 to %d bytes", in.ID, maxID)
	}
	if !in.Revoked {
		if _, err := s.kv.Create(ctx, instTokenKey(in.Token), []byte(in.ID)); err != nil {
			if !cluster.Conflict(err) {
				return cluster.Fail("import: instance token hint", err)
			}
			if e, err := cluster.Get(ctx, s.kv, instTokenKey(in.Token)); err != nil {
				return err
			} else if string(cluster.Value(e)) != in.ID {
				return fmt.Errorf("%w: instance %q: its token names another instance", ErrImportConflict, in.ID)
			}
		}
	}
	return s.importRecord(ctx, instanceKey(in.ID), instanceRecord{Account: in.Account, Name: in.Name,
		Created: in.Created.UTC(), Token: in.Token[:], Revoked: in.Revoked})
}

// ImportPairingKey imports one pairing key record.
func (s *Store) ImportPairingKey(p store.AgentPairingKey) error {
	if err := s.c.Writable("import pairing key"); err != nil {
		return err
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	return s.importRecord(ctx, pairingKey(p.Hash), pairingRecord{Account: p.Account, Created: p.Created.UTC(),
		Expires: p.Expires.UTC(), Used: p.Used, Instance: p.Instance})
}

// importRecord creates the record at key, or finds it already there with the
// same bytes.
func (s *Store) importRecord(ctx context.Context, key string, v any) error {
	raw, err := marshal(v)
	if err != nil {
		return err
	}
	if _, err := s.kv.Create(ctx, key, raw); err != nil {
		if !cluster.Conflict(err) {
			return cluster.Fail("import "+key, err)
		}
		e, err := cluster.Get(ctx, s.kv, key)
		if err != nil {
			return err
		}
		if e == nil || string(e.Value()) != string(raw) {
			return fmt.Errorf("%w: %s", ErrImportConflict, key)
		}
	}
	return nil
}

// WatchRevoked calls fn, from one goroutine, with the id of every instance
// revoked through any node from now until ctx ends, so that the node
// holding its link or clients closes them (agent.Handler.Revoked). For a
// revocation through this node the handler has closed them already and fn
// finds nothing to close. The watch is an ordered consumer, which resumes
// by itself after a reconnect.
func (s *Store) WatchRevoked(ctx context.Context, fn func(id string)) error {
	w, err := s.kv.Watch(ctx, "inst.>", jetstream.UpdatesOnly())
	if err != nil {
		return cluster.Fail("watch instances", err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			var e jetstream.KeyValueEntry
			var ok bool
			select {
			case <-ctx.Done():
				return
			case e, ok = <-w.Updates():
			}
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			id, err := hex.DecodeString(strings.TrimPrefix(e.Key(), "inst."))
			if err != nil {
				continue
			}
			var rec instanceRecord
			if json.Unmarshal(e.Value(), &rec) == nil && rec.Revoked {
				fn(string(id))
			}
		}
	}()
	return nil
}
