package turn

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCoturnClient runs coturn's own test client, turnutils_uclient
// (Debian package coturn), against our server with the REST secret (-W),
// in client-to-client mode (-y: pairs of allocations relaying to each
// other's relayed addresses, which are on loopback, so loopback peers are
// allowed), and expects every message back.
func TestCoturnClient(t *testing.T) {
	bin, err := exec.LookPath("turnutils_uclient")
	if err != nil {
		t.Fatal("turnutils_uclient (Debian package coturn) is not installed: run .ci/install-coturn.sh")
	}
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"udp channels", []string{"-y"}},
		{"udp send indications", []string{"-y", "-s"}},
		{"tcp channels", []string{"-y", "-t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := testServer(t, nil)
			port := strconv.Itoa(int(serverAddr(s).Port()))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			args := append(append([]string{}, tc.flags...),
				"-n", "50", "-l", "120", "-m", "2", "-z", "5",
				"-W", testSecret, "-u", "uclient", "-p", port, "127.0.0.1")
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("turnutils_uclient %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			lost := regexp.MustCompile(`Total lost packets (\d+)`).FindSubmatch(out)
			sent := regexp.MustCompile(`(?m)tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$`).FindAllSubmatch(out, -1)
			if lost == nil || sent == nil {
				t.Fatalf("no totals in turnutils_uclient's output:\n%s", out)
			}
			if string(lost[1]) != "0" {
				t.Errorf("turnutils_uclient lost %s packets:\n%s", lost[1], out)
			}
			last := sent[len(sent)-1]
			if string(last[1]) != "200" || string(last[2]) != "200" {
				t.Errorf("turnutils_uclient sent %s and received %s messages, want 200 each:\n%s", last[1], last[2], out)
			}
			upP, _, dnP, _ := s.relays.totals()
			if upP < 200 || dnP < 200 {
				t.Errorf("server relayed %d to peers and %d to clients, want at least 200 each", upP, dnP)
			}
		})
	}
}
