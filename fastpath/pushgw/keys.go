package pushgw

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"edgerelay/store"
)

// KeyInfo is what an operator sees of one API key; never the key itself.
type KeyInfo struct {
	ID        string     `json:"id"`
	Label     string     `json:"label"`
	Enabled   bool       `json:"enabled"`
	Active    bool       `json:"active"` // enabled and not expired, now
	CreatedAt time.Time  `json:"createdAt"`
	ExpiresAt *time.Time `json:"expiresAt"` // null: never
	Source    string     `json:"source"`    // "self" or "admin"
	// RegisteredIP is the address bucket of a self-registered key.
	RegisteredIP *string `json:"registeredIp"`
}

// NewKey is a key just created: its record and the key, shown once.
type NewKey struct {
	KeyInfo
	Key string `json:"key"`
}

// Errors of key management.
var (
	ErrBadLabel   = errors.New("pushgw: a label is 1 to 64 characters")
	ErrBadExpiry  = errors.New("pushgw: the expiry must be in the future")
	ErrUnknownKey = store.ErrUnknownPushKey
)

// Keys is the operator's management of one key store's API keys. It works
// on the store of a running server (through the admin listener) and, for
// Pebble, on the store alone while the server is stopped (Pebble's lock
// admits one process, so it is the only writer then).
type Keys struct {
	Store store.PushGatewayStore
	// Log receives key.created and key.revoked lines; nil discards.
	Log *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (k *Keys) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

func (k *Keys) logInfo(msg string, args ...any) {
	if k.Log != nil {
		k.Log.Info(msg, args...)
	}
}

// Create mints an operator key labelled label that expires at expires
// (zero: never) and returns it; the key itself is visible only here.
func (k *Keys) Create(label string, expires time.Time) (NewKey, error) {
	label = strings.TrimSpace(label)
	if label == "" || utf16Len([]byte(label)) > maxLabel {
		return NewKey{}, ErrBadLabel
	}
	now := k.now()
	if !expires.IsZero() && !expires.After(now) {
		return NewKey{}, ErrBadExpiry
	}
	secret, err := newAPIKey()
	if err != nil {
		return NewKey{}, err
	}
	rec := store.PushKey{
		ID: newID(), Hash: sha256.Sum256([]byte(secret)), Label: label, Enabled: true,
		CreatedAt: now.UTC().Truncate(time.Millisecond), Source: store.PushSourceAdmin,
	}
	if !expires.IsZero() {
		rec.ExpiresAt = expires.UTC().Truncate(time.Millisecond)
	}
	if err := k.Store.AddKey(rec); err != nil {
		return NewKey{}, fmt.Errorf("pushgw: create key: %w", err)
	}
	k.logInfo("key.created", "event", "key.created", "keyId", rec.ID, "source", store.PushSourceAdmin)
	return NewKey{KeyInfo: keyInfo(&rec, now), Key: secret}, nil
}

// List returns every key, oldest first.
func (k *Keys) List() ([]KeyInfo, error) {
	now := k.now()
	keys := k.Store.Keys()
	out := make([]KeyInfo, 0, len(keys))
	for i := range keys {
		out = append(out, keyInfo(&keys[i], now))
	}
	return out, nil
}

// Disable stops the key id from sending; Enable lets it send again. A
// disabled key's device-token claims are free for takeover once 60 s old.
func (k *Keys) Disable(id string) error { return k.setEnabled(id, false) }

// Enable re-enables a disabled key.
func (k *Keys) Enable(id string) error { return k.setEnabled(id, true) }

func (k *Keys) setEnabled(id string, enabled bool) error {
	if err := k.Store.SetKeyEnabled(id, enabled); err != nil {
		return fmt.Errorf("pushgw: key %s: %w", id, err)
	}
	event := "key.disabled"
	if enabled {
		event = "key.enabled"
	}
	k.logInfo(event, "event", event, "keyId", id)
	return nil
}

// Revoke deletes the key id: it is unknown from now on, and its
// device-token claims are free for takeover once 60 s old.
func (k *Keys) Revoke(id string) error {
	if err := k.Store.DeleteKey(id); err != nil {
		return fmt.Errorf("pushgw: key %s: %w", id, err)
	}
	k.logInfo("key.revoked", "event", "key.revoked", "keyId", id)
	return nil
}

func keyInfo(p *store.PushKey, now time.Time) KeyInfo {
	info := KeyInfo{
		ID: p.ID, Label: p.Label, Enabled: p.Enabled, Active: p.Active(now),
		CreatedAt: p.CreatedAt.UTC(), Source: p.Source,
	}
	if !p.ExpiresAt.IsZero() {
		t := p.ExpiresAt.UTC()
		info.ExpiresAt = &t
	}
	if p.RegisteredIP != "" {
		ip := p.RegisteredIP
		info.RegisteredIP = &ip
	}
	return info
}
