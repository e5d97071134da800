package agent

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// DefaultPairingTTL is how long a pairing key stays valid.
const DefaultPairingTTL = 15 * time.Minute

// ErrBadAccountName is returned for an account name outside 1 to 64
// letters, digits, dots, dashes or underscores.
var ErrBadAccountName = errors.New("agent: account names are 1 to 64 letters, digits, dots, dashes or underscores")

var accountPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// AccountInfo is what an operator sees of an account; never its token.
type AccountInfo struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	Instances int       `json:"instances"` // not revoked
}

// InstanceInfo is what an operator sees of an instance; never its token.
type InstanceInfo struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Account     string    `json:"account"` // the account's name
	AccountID   string    `json:"account_id"`
	Created     time.Time `json:"created"`
	Revoked     bool      `json:"revoked"`
	Connected   bool      `json:"connected"`
	Attachments int       `json:"attachments"`
}

// Keys is the operator's management of the agent relay: accounts, pairing
// keys and instances. It works with a running Handler (revoking closes the
// instance's link and clients) or on the store alone while the server is
// stopped (Handler nil).
type Keys struct {
	Store   store.AgentRecords
	Handler *Handler
	Now     func() time.Time
}

func (k Keys) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// AddAccount creates an account and returns its client token: the only
// time it is ever visible (the store keeps its hash).
func (k Keys) AddAccount(name string) (string, error) {
	if !accountPattern.MatchString(name) {
		return "", ErrBadAccountName
	}
	token := newSecret()
	if err := k.Store.AddAccount(newID("acct-"), name, httpx.Hash([]byte(token)), k.now()); err != nil {
		return "", err
	}
	return token, nil
}

// PairKey mints a single-use pairing key for account (its name or id),
// valid for ttl (DefaultPairingTTL when 0), and returns it: the only time
// it is ever visible.
func (k Keys) PairKey(account string, ttl time.Duration) (string, error) {
	if ttl < 0 {
		return "", fmt.Errorf("agent: pairing key lifetime %v is negative", ttl)
	}
	if ttl == 0 {
		ttl = DefaultPairingTTL
	}
	acct, err := k.Store.AccountByName(account)
	if errors.Is(err, store.ErrUnknownAccount) {
		acct, err = k.Store.Account(account)
	}
	if err != nil {
		return "", err
	}
	key := newSecret()
	now := k.now()
	if err := k.Store.AddPairingKey(httpx.Hash([]byte(key)), acct.ID, now, now.Add(ttl)); err != nil {
		return "", err
	}
	return key, nil
}

// Accounts lists every account.
func (k Keys) Accounts() ([]AccountInfo, error) {
	accounts, err := k.Store.Accounts()
	if err != nil {
		return nil, err
	}
	insts, err := k.Store.Instances()
	if err != nil {
		return nil, err
	}
	live := make(map[string]int)
	for _, in := range insts {
		if !in.Revoked {
			live[in.Account]++
		}
	}
	out := make([]AccountInfo, 0, len(accounts))
	for _, a := range accounts {
		out = append(out, AccountInfo{ID: a.ID, Name: a.Name, Created: a.Created, Instances: live[a.ID]})
	}
	return out, nil
}

// Instances lists every instance, revoked ones included, with whether it
// is connected and how many clients it has (known only with a Handler).
func (k Keys) Instances() ([]InstanceInfo, error) {
	insts, err := k.Store.Instances()
	if err != nil {
		return nil, err
	}
	accounts, err := k.Store.Accounts()
	if err != nil {
		return nil, err
	}
	names := make(map[string]string, len(accounts))
	for _, a := range accounts {
		names[a.ID] = a.Name
	}
	out := make([]InstanceInfo, 0, len(insts))
	for _, in := range insts {
		info := InstanceInfo{ID: in.ID, Name: in.Name, Account: names[in.Account], AccountID: in.Account,
			Created: in.Created, Revoked: in.Revoked}
		if k.Handler != nil {
			info.Connected = k.Handler.Connected(in.ID)
			info.Attachments = k.Handler.Attachments(in.ID)
		}
		out = append(out, info)
	}
	return out, nil
}

// RevokeInstance revokes instance id: its token is refused from now on,
// and with a running Handler its link is closed and its clients with 1008.
// store.ErrUnknownInstance for an id that was never paired.
func (k Keys) RevokeInstance(id string) error {
	if _, err := k.Store.RevokeInstance(id); err != nil {
		return err
	}
	if k.Handler != nil {
		k.Handler.disconnect(id)
		k.Handler.log.Info("instance revoked", "instance", id)
	}
	return nil
}
