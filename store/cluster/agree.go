package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
)

// configBucket holds what every node must agree on: a digest per setting,
// and the secrets the whole cluster shares.
const configBucket = "er_config"

// Setting is one value that must be equal on every node.
type Setting struct {
	Name  string // the setting's environment name: RELAY_TURN_SECRET
	Value string
}

// Agree checks settings against what the cluster holds, recording the
// values of the first node that starts with them. A value that differs
// fails with an error naming the setting; the cluster keeps only a SHA-256
// of each value, so a secret setting is not revealed by the store.
//
// Changing such a setting means changing it on every node and clearing
// the record (`edgerelay cluster forget-setting NAME`); until then a node
// with the new value refuses to start, which is the point: two nodes with
// two TURN secrets or two sets of limits would answer one client two ways.
func (c *Cluster) Agree(ctx context.Context, settings []Setting) error {
	kv, err := c.Bucket(ctx, BucketConfig{Name: configBucket})
	if err != nil {
		return err
	}
	for _, s := range settings {
		sum := sha256.Sum256([]byte(s.Name + "\x00" + s.Value))
		want := []byte(hex.EncodeToString(sum[:]))
		key := "setting." + s.Name
		var held []byte
		// Retried until ctx ends: a node that starts while another is
		// killed (its stream leader gone for the election) waits, as for
		// the first write of Open, instead of giving up its start.
		if err := c.retry(ctx, "agree on "+s.Name, func(ctx context.Context) error {
			_, err := Update(ctx, kv, key, func(cur []byte, _ uint64) ([]byte, error) {
				held = cur
				if cur != nil {
					return nil, ErrSkip
				}
				return want, nil
			})
			return err
		}); err != nil {
			return err
		}
		if held != nil && subtle.ConstantTimeCompare(held, want) != 1 {
			return fmt.Errorf("cluster: %s differs from the value the other nodes of the cluster run with: give every node the same %s (to change it everywhere, stop using the old value on every node and run edgerelay cluster forget-setting %s)", s.Name, s.Name, s.Name)
		}
	}
	return nil
}

// ForgetSetting drops the record of one setting, so that the next node to
// start records its value.
func (c *Cluster) ForgetSetting(ctx context.Context, name string) error {
	kv, err := c.Bucket(ctx, BucketConfig{Name: configBucket})
	if err != nil {
		return err
	}
	return Delete(ctx, kv, "setting."+name, 0)
}

// ErrSecretDiffers is returned by SharedSecret when this node holds a value
// of its own that is not the cluster's.
var ErrSecretDiffers = errors.New("cluster: this node's value differs from the cluster's")

// SharedSecret returns the cluster's value of a secret that every node must
// hold the same (the agent relay's signing key, which runtimes pin). The
// first node to ask stores its local value, or one made by generate when it
// has none; the others adopt it. A node whose local value differs gets
// ErrSecretDiffers: it must not quietly switch a key its clients trust.
//
// The value is kept as it is (a signing key cannot be a hash): the NATS
// store is inside the cluster's trust boundary, like each node's data dir
// that holds the same key in single-node mode (CLUSTER.md §2: NATS runs in
// its own account and is never exposed to clients).
func (c *Cluster) SharedSecret(ctx context.Context, name string, local []byte, generate func() ([]byte, error)) ([]byte, error) {
	kv, err := c.Bucket(ctx, BucketConfig{Name: configBucket})
	if err != nil {
		return nil, err
	}
	key := "secret." + name
	var held []byte
	if _, err := Update(ctx, kv, key, func(cur []byte, _ uint64) ([]byte, error) {
		if cur != nil {
			held = cur
			return nil, ErrSkip
		}
		v := local
		if v == nil {
			if v, err = generate(); err != nil {
				return nil, err
			}
		}
		held = v
		return v, nil
	}); err != nil {
		return nil, fmt.Errorf("cluster: shared %s: %w", name, err)
	}
	if local != nil && !bytes.Equal(held, local) {
		return nil, fmt.Errorf("%w: %s", ErrSecretDiffers, name)
	}
	return held, nil
}
