package e2e

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/pion/logging"
	pionturn "github.com/pion/turn/v4"
)

// TestSignalNode runs test/node/signal.mjs against the relay: two
// SignalChannels of one link (peer 1, sealed frames both ways, the 64 KiB
// limit, peer 0), a plain WebSocket with the bearer replacing one side
// (4000 "replaced") and sending forged, garbage, stale and replayed frames
// that the other side drops and counts, and fetchIce. The credential the
// script got is then used here for a real TURN allocation on the relay's
// TURN server, so "the relay's TURN accepts it" is checked, not assumed.
func TestSignalNode(t *testing.T) {
	r := startRelay(t)
	out := runNode(t, []string{
		"MAILBOX=" + r.mailboxOrigin(),
		"TURN_ADDR=" + r.addrs["turn"],
		"TURN_SECRET=e2e-turn-secret",
	}, "test/node/signal.mjs")
	if !strings.Contains(out, "signal ok") {
		t.Fatalf("signal.mjs did not finish:\n%s", out)
	}
	var ice struct {
		URLs                 []string
		Username, Credential string
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "ICE "); ok {
			if err := json.Unmarshal([]byte(rest), &ice); err != nil {
				t.Fatalf("ICE line %q: %v", rest, err)
			}
		}
	}
	if ice.Username == "" {
		t.Fatalf("no ICE line:\n%s", out)
	}
	allocate := func(password string) error {
		conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		client, err := pionturn.NewClient(&pionturn.ClientConfig{
			TURNServerAddr: r.addrs["turn"], Username: ice.Username, Password: password,
			Conn: conn, LoggerFactory: logging.NewDefaultLoggerFactory(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		if err := client.Listen(); err != nil {
			t.Fatal(err)
		}
		relayed, err := client.Allocate()
		if err != nil {
			return err
		}
		return relayed.Close()
	}
	if err := allocate(ice.Credential); err != nil {
		t.Fatalf("TURN allocation with the credential fetchIce returned: %v", err)
	}
	// The check can fail: one changed character of the credential is refused.
	bad := []byte(ice.Credential)
	if bad[0] == 'A' {
		bad[0] = 'B'
	} else {
		bad[0] = 'A'
	}
	if err := allocate(string(bad)); err == nil {
		t.Fatal("TURN allocated with a wrong credential")
	}
}
