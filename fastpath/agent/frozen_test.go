package agent_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

// TestFrozenClient: one attachment stops reading. The instance keeps
// sending to it and to another attachment; the other attachment gets every
// frame in order while the frozen one's queue fills, the frozen one is
// closed with 1013 at its bound, and the instance is told it left.
func TestFrozenClient(t *testing.T) {
	const queue = 256 << 10
	r := startRelay(t, relayOpts{clientQueue: queue})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)

	frozen := r.attach(p.id, ctok)
	frozen.send(`{"type":"acp.message","id":"i-am-frozen"}`)
	frozenSess := next(t, c).Session
	live, liveSess := r.attachedSession(p, ctok, c)

	// 16 KiB frames, alternating: 24 MiB to the frozen client, far more
	// than its queue and the socket buffers hold. The instance keeps at
	// most 4 frames ahead of the live client, well within its bound: the
	// live client is slow too, but not stuck. (The relay's writer hands a
	// batch of queued frames to the socket in one write, and they count
	// against the bound until the write returns, although the client may
	// be reading the first of them already: up to about twice the window
	// is queued at a time.)
	pad := strings.Repeat("x", 16<<10)
	const frames, window = 1536, 4
	progress := make(chan int, frames)
	received := make(chan error, 1)
	go func() {
		for i := range frames {
			_ = live.c.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, msg, err := live.c.ReadMessage()
			if err != nil {
				received <- err
				return
			}
			if want := `"n":` + strconv.Itoa(i) + `,`; !strings.Contains(string(msg), want) {
				received <- &mismatch{got: string(msg[:80]), want: want}
				return
			}
			progress <- i
		}
		received <- nil
	}()
	start := time.Now()
	seen := -1
	for i := range frames {
		for seen < i-window {
			select {
			case seen = <-progress:
			case err := <-received:
				t.Fatalf("the live client after %d frames (sent %d): %v", seen, i, err)
			}
		}
		for _, sess := range []string{frozenSess, liveSess} {
			line := `{"type":"acp.message","instance":"` + p.id + `","session":"` + sess + `","n":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`
			if err := c.Send([]byte(line)); err != nil {
				t.Fatalf("instance blocked or cut off at frame %d: %v", i, err)
			}
		}
	}
	if err := <-received; err != nil {
		t.Fatalf("the live client: %v", err)
	}
	t.Logf("%d frames to each client in %v", frames, time.Since(start))

	// The frozen client was dropped at its bound, and the instance heard
	// of it at once.
	f := next(t, c)
	if f.Type != "acp.detach" || f.Session != frozenSess {
		t.Fatalf("instance got %.200s, want the frozen client's detach", f.Raw)
	}
	// When it reads at last it finds what fit, then 1013. (Had it not
	// read for the close timeout, the relay would have cut the socket
	// without the close frame.)
	if code := frozen.closeCode(); code != 1013 {
		t.Fatalf("frozen client closed with %d, want 1013", code)
	}
	// Everything else still flows.
	live.send(`{"type":"acp.message","id":"still-here"}`)
	if f := next(t, c); f.ID != "still-here" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
}

type mismatch struct{ got, want string }

func (m *mismatch) Error() string { return "got " + m.got + ", want " + m.want }

// TestSlowInstanceHoldsBackClients: when the instance stops reading, a
// client flooding it waits for room in the link's queue (its own socket is
// no longer read) instead of growing memory; the relay stays responsive to
// other instances.
func TestSlowInstanceHoldsBackClients(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	q := r.pair("acme", "host-2")
	// The instance: welcomed, then never reads again.
	conn, br := r.rawLink(p.token)
	if _, err := conn.Write([]byte(rawHello(p.id))); err != nil {
		t.Fatal(err)
	}
	if w, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(w, `{"type":"relay.welcome"`) {
		t.Fatalf("welcome %q %v", w, err)
	}
	cl := r.attach(p.id, ctok)
	// 64 MiB from the client: more than the link queue (32 MiB), the
	// connector's frame channel and the socket buffers hold.
	pad := strings.Repeat("y", 64<<10)
	done := make(chan error, 1)
	go func() {
		for range 1024 {
			if err := cl.c.WriteMessage(websocket.TextMessage, []byte(`{"type":"acp.message","pad":"`+pad+`"}`)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		t.Fatalf("the flood was absorbed entirely (%v): nothing held the client back", err)
	case <-time.After(2 * time.Second):
	}
	// Another instance is unaffected.
	cq := r.connect(q)
	other, _ := r.attachedSession(q, ctok, cq)
	other.send(`{"type":"acp.message","id":"fine"}`)
	if f := next(t, cq); f.ID != "fine" {
		t.Fatalf("got %s", f.Raw)
	}
}
