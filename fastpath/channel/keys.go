package channel

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"time"

	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// KeyInfo is what an operator sees of one claim key; never the key itself.
type KeyInfo struct {
	Host      string    `json:"host"`
	Created   time.Time `json:"created"`
	Used      bool      `json:"used"`
	Claimed   bool      `json:"claimed"`
	Connected bool      `json:"connected"`
}

// Keys is the operator's management of claim keys. It works with a running
// Handler (revoking disconnects the computer) or on the store alone while
// the server is stopped (Handler nil).
type Keys struct {
	Claims  store.ChannelClaimStore
	Handler *Handler
	Now     func() time.Time
}

// ErrBadHost is returned for a host name outside HostPattern.
var ErrBadHost = errors.New("channel: host names are 1 to 64 letters, digits, dots, dashes or underscores")

var hostPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// NewClaimKey returns a fresh claim key: 64 lowercase hex characters.
func NewClaimKey() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("channel: claim key: %w", err)
	}
	return hex.EncodeToString(raw[:]), nil
}

// Add creates a claim key for host, stores its hash and returns the key:
// the only time it is ever visible.
func (k Keys) Add(host string) (string, error) {
	if !hostPattern.MatchString(host) {
		return "", ErrBadHost
	}
	key, err := NewClaimKey()
	if err != nil {
		return "", err
	}
	if err := k.Claims.AddKey(httpx.Hash([]byte(key)), host, k.now()); err != nil {
		return "", err
	}
	return key, nil
}

// AddExisting stores the hash of a key the operator already holds (the v1
// bootstrap.secret) for host, unless that key is already stored.
func (k Keys) AddExisting(host, key string) error {
	if !httpx.IsLowerHex([]byte(key), 64) {
		return errors.New("channel: a claim key is 64 lowercase hex characters")
	}
	h := httpx.Hash([]byte(key))
	if ok, err := k.Claims.HasKey(h); err != nil || ok {
		return err
	}
	return k.Claims.AddKey(h, host, k.now())
}

// List returns every claim key's state.
func (k Keys) List() ([]KeyInfo, error) {
	keys, err := k.Claims.Keys()
	if err != nil {
		return nil, err
	}
	out := make([]KeyInfo, 0, len(keys))
	for _, c := range keys {
		info := KeyInfo{Host: c.Host, Created: c.Created, Used: c.Used, Claimed: c.Claimed}
		if k.Handler != nil {
			info.Connected = k.Handler.Connected(c.Hash)
		}
		out = append(out, info)
	}
	return out, nil
}

// Revoke removes host's key; a connected computer is disconnected.
func (k Keys) Revoke(host string) error {
	if k.Handler != nil {
		return k.Handler.Revoke(host)
	}
	_, err := k.Claims.Revoke(host)
	return err
}

func (k Keys) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}
