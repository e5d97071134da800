package main

import (
	"testing"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/store/mailboxlocal"
)

// RELAY_ENVELOPE_CACHE=0 (or empty) keeps no cache, where the mailbox
// package's 0 means its default: serve maps one onto the other.
func TestEnvelopeCacheSetting(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
	}{
		{"", -1},
		{"0", -1},
		{"1048576", 1 << 20},
	} {
		v, err := config.Load(nil, []string{config.EnvEnvelopeCache + "=" + tc.env, config.EnvDataDir + "=" + t.TempDir()}, nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.env, err)
		}
		c, err := v.Config()
		if err != nil {
			t.Fatalf("%q: %v", tc.env, err)
		}
		if got := envelopeCache(c.Mailbox.EnvelopeCache); got != tc.want {
			t.Errorf("RELAY_ENVELOPE_CACHE=%q: mailbox.Config.EnvelopeCache %d, want %d", tc.env, got, tc.want)
		}
	}
	if got := envelopeCache(mailboxlocal.DefaultEnvelopeCache); got != mailboxlocal.DefaultEnvelopeCache {
		t.Errorf("the default maps to %d", got)
	}
}
