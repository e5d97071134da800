package store

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Agent relay keys. Accounts own client tokens and instances; an instance
// is created by redeeming a pairing key minted for an account:
//
//	'a' 'a' <account id>             account record (JSON agentAccountRecord)
//	'a' 'c' <sha256 client token>    client token index -> account id
//	'a' 'k' <sha256 pairing key>     pairing key record (JSON agentPairingRecord)
//	'a' 'i' <instance id>            instance record (JSON agentInstanceRecord)
//	'a' 't' <sha256 instance token>  instance token index -> instance id
//
// Ids are chosen by the caller (fastpath/agent makes them random and
// printable); they never contain a secret. Secrets (client tokens, pairing
// keys, instance tokens) exist here only as SHA-256 digests. A revoked
// instance keeps its record (so the operator sees it in the list) but loses
// its token index, so its token is unknown from the commit on. A used or
// expired pairing key keeps its record until it is pruned a day after its
// expiry, so that redeeming it again says "used" or "expired" rather than
// "unknown" while anybody could still be retrying.
const (
	serviceAgent = 'a'

	kindAgentAccount     = 'a'
	kindAgentClientToken = 'c'
	kindAgentPairingKey  = 'k'
	kindAgentInstance    = 'i'
	kindAgentInstToken   = 't'
)

// Errors of the agent relay's records.
var (
	ErrAccountExists   = errors.New("store: account name already exists")
	ErrUnknownAccount  = errors.New("store: unknown account")
	ErrPairingUnknown  = errors.New("store: unknown pairing key")
	ErrPairingUsed     = errors.New("store: pairing key already used")
	ErrPairingExpired  = errors.New("store: pairing key expired")
	ErrUnknownInstance = errors.New("store: unknown instance")
	ErrInstanceExists  = errors.New("store: instance id already exists")
)

// pairingRetention is how long a used or expired pairing key's record is
// kept after its expiry before a later PairKey prunes it.
const pairingRetention = 24 * time.Hour

// AgentAccount is one account of the agent relay.
type AgentAccount struct {
	ID      string
	Name    string
	Created time.Time
	// ClientToken is the SHA-256 of the account's client token.
	ClientToken Hash
}

// AgentInstance is one paired agent runtime.
type AgentInstance struct {
	ID      string
	Account string // account id
	Name    string // the instance_name it paired with (its host name)
	Created time.Time
	// Token is the SHA-256 of the instance token.
	Token   Hash
	Revoked bool
}

// AgentPairingKey is what the store knows of one pairing key.
type AgentPairingKey struct {
	Hash     Hash
	Account  string
	Created  time.Time
	Expires  time.Time
	Used     bool
	Instance string // the instance it created, once used
}

// The JSON records. They are written rarely (an account, a pairing, a
// revocation), so JSON keeps them readable in a debugger at no cost that
// matters.
type agentAccountRecord struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Client  []byte    `json:"client"`
}

type agentPairingRecord struct {
	Account  string    `json:"account"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
	Used     bool      `json:"used"`
	Instance string    `json:"instance,omitempty"`
}

type agentInstanceRecord struct {
	Account string    `json:"account"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Token   []byte    `json:"token"`
	Revoked bool      `json:"revoked,omitempty"`
}

// AgentRecords is the durable state of the agent relay as its handler, its
// key management and the admin listener use it. *AgentStore (Pebble, one
// node) and store/cluster/agentkv (shared by every node of a cluster)
// implement it with the same behaviour; store/storetest.Agent is the
// contract both pass.
type AgentRecords interface {
	// AddAccount stores a new account; names are unique (ErrAccountExists).
	AddAccount(id, name string, client Hash, now time.Time) error
	// Accounts lists every account, ordered by name.
	Accounts() ([]AgentAccount, error)
	// Account and AccountByName find one account, or ErrUnknownAccount.
	Account(id string) (AgentAccount, error)
	AccountByName(name string) (AgentAccount, error)
	// AccountByClientToken finds the account of a client token hash, or
	// ErrUnknownToken.
	AccountByClientToken(h Hash) (AgentAccount, error)
	// AddPairingKey stores a pairing key hash for account until expires.
	AddPairingKey(h Hash, account string, now, expires time.Time) error
	// RedeemPairingKey spends a pairing key at most once, creating the
	// instance: ErrPairingUnknown, ErrPairingUsed, ErrPairingExpired or
	// ErrInstanceExists change nothing.
	RedeemPairingKey(h Hash, id, name string, token Hash, now time.Time) (AgentInstance, error)
	// Instance finds an instance by id (revoked or not), or
	// ErrUnknownInstance; InstanceByToken a live one by its token hash, or
	// ErrUnknownToken.
	Instance(id string) (AgentInstance, error)
	InstanceByToken(h Hash) (AgentInstance, error)
	// Instances lists every instance, ordered by account, name, id.
	Instances() ([]AgentInstance, error)
	// RevokeInstance marks an instance revoked: its token is refused from
	// the return on, on every node.
	RevokeInstance(id string) (AgentInstance, error)
}

var _ AgentRecords = (*AgentStore)(nil)

// AgentStore is the durable state of the agent relay. One mutex serializes
// every state change so that check-then-write is atomic (of two racing
// redemptions of one pairing key exactly one wins); changes are rare
// (operator commands, pairings), so one lock costs nothing that matters.
// Lookups by token take no lock: they read committed records only.
type AgentStore struct {
	db *DB
	mu sync.Mutex
}

// NewAgentStore returns the agent keyspace of db.
func NewAgentStore(db *DB) *AgentStore { return &AgentStore{db: db} }

func agentAccountKey(id string) []byte  { return key2(serviceAgent, kindAgentAccount, []byte(id)) }
func agentClientKey(h Hash) []byte      { return key2(serviceAgent, kindAgentClientToken, h[:]) }
func agentPairingKey(h Hash) []byte     { return key2(serviceAgent, kindAgentPairingKey, h[:]) }
func agentInstanceKey(id string) []byte { return key2(serviceAgent, kindAgentInstance, []byte(id)) }
func agentInstTokenKey(h Hash) []byte   { return key2(serviceAgent, kindAgentInstToken, h[:]) }
func agentPrefix(kind byte) []byte      { return []byte{serviceAgent, kind} }

// getJSON loads the JSON record at key into v.
func (s *AgentStore) getJSON(key []byte, v any) error {
	raw, err := s.db.Get(key)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("store: agent record: %w", err)
	}
	return nil
}

// setAll commits key/value pairs (a nil value deletes) as one synced batch.
func (s *AgentStore) setAll(kvs ...[2][]byte) error {
	b := s.db.NewBatch()
	for _, kv := range kvs {
		var err error
		if kv[1] == nil {
			err = b.Delete(kv[0])
		} else {
			err = b.Set(kv[0], kv[1])
		}
		if err != nil {
			b.Discard()
			return err
		}
	}
	return s.db.Commit(b)
}

// toHash copies a stored digest into a Hash.
func toHash(b []byte) (h Hash) {
	copy(h[:], b)
	return h
}

func marshal(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("store: encode agent record: %w", err)
	}
	return raw, nil
}

// AddAccount stores a new account with the hash of its client token.
// Account names are unique, so that an operator can name an account in
// later commands.
func (s *AgentStore) AddAccount(id, name string, client Hash, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	accounts, err := s.accounts()
	if err != nil {
		return err
	}
	for _, a := range accounts {
		if a.Name == name {
			return fmt.Errorf("%w: %q", ErrAccountExists, name)
		}
		if a.ID == id {
			return fmt.Errorf("store: account id %q already exists", id)
		}
	}
	if _, err := s.db.Get(agentClientKey(client)); err == nil {
		return errors.New("store: client token already stored")
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	raw, err := marshal(agentAccountRecord{Name: name, Created: now.UTC(), Client: client[:]})
	if err != nil {
		return err
	}
	return s.setAll([2][]byte{agentAccountKey(id), raw}, [2][]byte{agentClientKey(client), []byte(id)})
}

// Accounts lists every account, ordered by name.
func (s *AgentStore) Accounts() ([]AgentAccount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accounts()
}

func (s *AgentStore) accounts() ([]AgentAccount, error) {
	var out []AgentAccount
	err := s.db.Scan(agentPrefix(kindAgentAccount), func(k, v []byte) error {
		var rec agentAccountRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("store: agent account record: %w", err)
		}
		out = append(out, AgentAccount{ID: string(k[2:]), Name: rec.Name, Created: rec.Created, ClientToken: toHash(rec.Client)})
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// Account returns the account with id, or ErrUnknownAccount.
func (s *AgentStore) Account(id string) (AgentAccount, error) {
	var rec agentAccountRecord
	err := s.getJSON(agentAccountKey(id), &rec)
	if errors.Is(err, ErrNotFound) {
		return AgentAccount{}, fmt.Errorf("%w: %q", ErrUnknownAccount, id)
	}
	if err != nil {
		return AgentAccount{}, err
	}
	return AgentAccount{ID: id, Name: rec.Name, Created: rec.Created, ClientToken: toHash(rec.Client)}, nil
}

// AccountByName returns the account called name, or ErrUnknownAccount.
func (s *AgentStore) AccountByName(name string) (AgentAccount, error) {
	accounts, err := s.Accounts()
	if err != nil {
		return AgentAccount{}, err
	}
	for _, a := range accounts {
		if a.Name == name {
			return a, nil
		}
	}
	return AgentAccount{}, fmt.Errorf("%w: %q", ErrUnknownAccount, name)
}

// AccountByClientToken finds the account whose client token hashes to h,
// or ErrUnknownToken.
func (s *AgentStore) AccountByClientToken(h Hash) (AgentAccount, error) {
	id, err := s.db.Get(agentClientKey(h))
	if errors.Is(err, ErrNotFound) {
		return AgentAccount{}, ErrUnknownToken
	}
	if err != nil {
		return AgentAccount{}, err
	}
	a, err := s.Account(string(id))
	if errors.Is(err, ErrUnknownAccount) {
		return AgentAccount{}, ErrUnknownToken
	}
	if err != nil {
		return AgentAccount{}, err
	}
	if subtle.ConstantTimeCompare(a.ClientToken[:], h[:]) != 1 {
		return AgentAccount{}, ErrUnknownToken
	}
	return a, nil
}

// AddPairingKey stores a pairing key hash for account, valid until expires.
// Records of pairing keys that expired more than a day ago are pruned in
// the same batch, so the keyspace stays bounded however many keys an
// operator mints.
func (s *AgentStore) AddPairingKey(h Hash, account string, now, expires time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.Account(account); err != nil {
		return err
	}
	if _, err := s.db.Get(agentPairingKey(h)); err == nil {
		return errors.New("store: pairing key already stored")
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	raw, err := marshal(agentPairingRecord{Account: account, Created: now.UTC(), Expires: expires.UTC()})
	if err != nil {
		return err
	}
	kvs := [][2][]byte{{agentPairingKey(h), raw}}
	err = s.db.Scan(agentPrefix(kindAgentPairingKey), func(k, v []byte) error {
		var rec agentPairingRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("store: agent pairing record: %w", err)
		}
		if now.Sub(rec.Expires) > pairingRetention {
			kvs = append(kvs, [2][]byte{append([]byte(nil), k...), nil})
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.setAll(kvs...)
}

// PairingKeys lists every stored pairing key record (never the key).
func (s *AgentStore) PairingKeys() ([]AgentPairingKey, error) {
	var out []AgentPairingKey
	err := s.db.Scan(agentPrefix(kindAgentPairingKey), func(k, v []byte) error {
		var rec agentPairingRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("store: agent pairing record: %w", err)
		}
		out = append(out, AgentPairingKey{Hash: toHash(k[2:]), Account: rec.Account, Created: rec.Created,
			Expires: rec.Expires, Used: rec.Used, Instance: rec.Instance})
		return nil
	})
	return out, err
}

// RedeemPairingKey spends the pairing key h: it creates the instance id
// named name with the hash of its token, in the key's account, and marks
// the key used, in one synced batch. It fails with ErrPairingUnknown,
// ErrPairingUsed or ErrPairingExpired and then changes nothing.
func (s *AgentStore) RedeemPairingKey(h Hash, id, name string, token Hash, now time.Time) (AgentInstance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rec agentPairingRecord
	err := s.getJSON(agentPairingKey(h), &rec)
	switch {
	case errors.Is(err, ErrNotFound):
		return AgentInstance{}, ErrPairingUnknown
	case err != nil:
		return AgentInstance{}, err
	case rec.Used:
		return AgentInstance{}, ErrPairingUsed
	case !now.Before(rec.Expires):
		return AgentInstance{}, ErrPairingExpired
	}
	if _, err := s.Account(rec.Account); errors.Is(err, ErrUnknownAccount) {
		return AgentInstance{}, ErrPairingUnknown
	} else if err != nil {
		return AgentInstance{}, err
	}
	if _, err := s.db.Get(agentInstanceKey(id)); err == nil {
		return AgentInstance{}, fmt.Errorf("%w: %q", ErrInstanceExists, id)
	} else if !errors.Is(err, ErrNotFound) {
		return AgentInstance{}, err
	}
	inst := AgentInstance{ID: id, Account: rec.Account, Name: name, Created: now.UTC(), Token: token}
	instRaw, err := marshal(agentInstanceRecord{Account: inst.Account, Name: name, Created: inst.Created, Token: token[:]})
	if err != nil {
		return AgentInstance{}, err
	}
	rec.Used, rec.Instance = true, id
	keyRaw, err := marshal(rec)
	if err != nil {
		return AgentInstance{}, err
	}
	err = s.setAll(
		[2][]byte{agentPairingKey(h), keyRaw},
		[2][]byte{agentInstanceKey(id), instRaw},
		[2][]byte{agentInstTokenKey(token), []byte(id)},
	)
	if err != nil {
		return AgentInstance{}, err
	}
	return inst, nil
}

func toInstance(id string, rec agentInstanceRecord) AgentInstance {
	return AgentInstance{ID: id, Account: rec.Account, Name: rec.Name, Created: rec.Created,
		Token: toHash(rec.Token), Revoked: rec.Revoked}
}

// Instance returns the instance with id (revoked or not), or
// ErrUnknownInstance.
func (s *AgentStore) Instance(id string) (AgentInstance, error) {
	var rec agentInstanceRecord
	err := s.getJSON(agentInstanceKey(id), &rec)
	if errors.Is(err, ErrNotFound) {
		return AgentInstance{}, fmt.Errorf("%w: %q", ErrUnknownInstance, id)
	}
	if err != nil {
		return AgentInstance{}, err
	}
	return toInstance(id, rec), nil
}

// InstanceByToken finds the live (not revoked) instance whose token hashes
// to h, or ErrUnknownToken.
func (s *AgentStore) InstanceByToken(h Hash) (AgentInstance, error) {
	id, err := s.db.Get(agentInstTokenKey(h))
	if errors.Is(err, ErrNotFound) {
		return AgentInstance{}, ErrUnknownToken
	}
	if err != nil {
		return AgentInstance{}, err
	}
	inst, err := s.Instance(string(id))
	if errors.Is(err, ErrUnknownInstance) {
		return AgentInstance{}, ErrUnknownToken
	}
	if err != nil {
		return AgentInstance{}, err
	}
	if inst.Revoked || subtle.ConstantTimeCompare(inst.Token[:], h[:]) != 1 {
		return AgentInstance{}, ErrUnknownToken
	}
	return inst, nil
}

// Instances lists every instance, revoked ones included, ordered by
// account, then name, then id.
func (s *AgentStore) Instances() ([]AgentInstance, error) {
	var out []AgentInstance
	err := s.db.Scan(agentPrefix(kindAgentInstance), func(k, v []byte) error {
		var rec agentInstanceRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("store: agent instance record: %w", err)
		}
		out = append(out, toInstance(string(k[2:]), rec))
		return nil
	})
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
	return out, err
}

// RevokeInstance marks the instance revoked and forgets its token, so the
// token is refused from the commit on. Revoking a revoked instance is not
// an error.
func (s *AgentStore) RevokeInstance(id string) (AgentInstance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, err := s.Instance(id)
	if err != nil {
		return AgentInstance{}, err
	}
	if inst.Revoked {
		return inst, nil
	}
	inst.Revoked = true
	raw, err := marshal(agentInstanceRecord{Account: inst.Account, Name: inst.Name, Created: inst.Created,
		Token: inst.Token[:], Revoked: true})
	if err != nil {
		return AgentInstance{}, err
	}
	err = s.setAll([2][]byte{agentInstanceKey(id), raw}, [2][]byte{agentInstTokenKey(inst.Token), nil})
	if err != nil {
		return AgentInstance{}, err
	}
	return inst, nil
}
