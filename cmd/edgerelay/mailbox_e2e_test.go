package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// TestMailboxWithTheSDK runs a link's whole life through the real binary
// with the project's own SDK: both devices derive the token, the primary
// seals and writes, the companion watches (bearer as a subprotocol, as a
// browser must), batches, opens and prunes.
func TestMailboxWithTheSDK(t *testing.T) {
	s := startServer(t, "RELAY_MAILBOX_LISTEN=127.0.0.1:0", "RELAY_APPS=notes;chat:signal")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	client := &sdkmailbox.Client{BaseURL: s.origin("mailbox"), App: "chat"}
	primary := client.Mailbox(l.ID, l.AccessToken())
	companion := client.Mailbox(l.ID, l.AccessToken())
	if created, err := primary.Claim(ctx); err != nil || !created {
		t.Fatalf("claim: %v %v", created, err)
	}
	if created, err := companion.Claim(ctx); err != nil || created {
		t.Fatalf("second claim: %v %v", created, err)
	}
	stranger := client.Mailbox(l.ID, "another-token-0123456789")
	var e *sdkmailbox.Error
	if _, err := stranger.Claim(ctx); !errors.As(err, &e) || e.Status != 409 || e.Code != "taken" {
		t.Fatalf("stranger claim: %v", err)
	}

	sealer, err := link.NewSealer(l.EnvelopeKey(link.P2C))
	if err != nil {
		t.Fatal(err)
	}
	reader, err := link.NewReader(l.EnvelopeKey(link.P2C), 0)
	if err != nil {
		t.Fatal(err)
	}
	seal := func(seq uint64, msg string) []byte {
		env, err := sealer.Seal(nil, seq, []byte(msg))
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	for seq, msg := range []string{"one", "two"} {
		if stored, err := primary.Put(ctx, link.P2C, uint64(seq+1), seal(uint64(seq+1), msg), ""); err != nil || !stored {
			t.Fatalf("put %d: %v %v", seq+1, stored, err)
		}
	}
	w, err := companion.Watch(ctx, link.P2C, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, want := range []string{"one", "two"} {
		env, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, pt, err := reader.Accept(nil, env); err != nil || string(pt) != want {
			t.Fatalf("replayed %q %v", pt, err)
		}
	}
	if _, err := primary.Put(ctx, link.P2C, 3, seal(3, "three"), "alert"); err != nil {
		t.Fatal(err)
	}
	env, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, pt, err := reader.Accept(nil, env); err != nil || string(pt) != "three" {
		t.Fatalf("live %q %v", pt, err)
	}
	if err := w.Ping(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Pongs():
	case <-ctx.Done():
		t.Fatal("no pong")
	}

	envs, more, err := companion.Batch(ctx, link.P2C, 1, 100)
	if err != nil || more || len(envs) != 2 {
		t.Fatalf("batch: %d %v %v", len(envs), more, err)
	}
	if first, last, count, err := companion.Head(ctx, link.P2C); err != nil || first != 1 || last != 3 || count != 3 {
		t.Fatalf("head: %d %d %d %v", first, last, count, err)
	}
	if err := companion.Prune(ctx, link.P2C, 3); err != nil {
		t.Fatal(err)
	}
	if _, _, count, _ := companion.Head(ctx, link.P2C); count != 0 {
		t.Fatalf("count after prune %d", count)
	}
	if err := primary.Erase(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Next(ctx); err == nil {
		t.Fatal("watch survived the erase")
	} else if code, ok := sdkmailbox.CloseCode(err); !ok || code != 1000 {
		t.Fatalf("watch closed with %d %v", code, err)
	}
}
