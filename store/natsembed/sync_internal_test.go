package natsembed

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"
)

// The promise cluster mode rests on: a running node's JetStream fsyncs every
// write before it acknowledges (sync_interval: always), in the cluster named
// ClusterName, storing under StoreDir.
func TestStartSyncAlways(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Start(ctx, Config{
		NodeName: "s", ClientListen: "127.0.0.1:0", ClusterListen: self,
		Routes: []string{"nats-route://" + self}, StoreDir: dir, Replicas: 1,
	}, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	js := n.srv.JetStreamConfig()
	if js == nil || !js.SyncAlways || js.StoreDir == "" {
		t.Fatalf("JetStream config %+v, want SyncAlways under %s", js, dir)
	}
	if got := n.srv.ClusterName(); got != ClusterName {
		t.Fatalf("cluster name %q, want %q", got, ClusterName)
	}
}
