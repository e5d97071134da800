package apns

import (
	"strings"
	"testing"

	"edgerelay/push/pushtest"
)

// TestHosts checks which host a notification goes to: Apple's per
// environment, the device's own environment first, a base URL for all.
func TestHosts(t *testing.T) {
	p8, _ := pushtest.NewAPNsKey(t)
	key := pushtest.WriteFile(t, "k.p8", p8)
	const tok = "00ff"
	cases := []struct {
		clientEnv, baseURL, deviceEnv string
		want                          string
	}{
		{"", "", "", "https://api.push.apple.com/3/device/00ff"},
		{"production", "", "", "https://api.push.apple.com/3/device/00ff"},
		{"development", "", "", "https://api.sandbox.push.apple.com/3/device/00ff"},
		{"sandbox", "", "", "https://api.sandbox.push.apple.com/3/device/00ff"},
		{"production", "", "development", "https://api.sandbox.push.apple.com/3/device/00ff"},
		{"development", "", "production", "https://api.push.apple.com/3/device/00ff"},
		{"", "https://127.0.0.1:9/", "development", "https://127.0.0.1:9/3/device/00ff"},
		{"", "https://127.0.0.1:9", "production", "https://127.0.0.1:9/3/device/00ff"},
	}
	for _, tc := range cases {
		c, err := New(Config{KeyFile: key, KeyID: "K", TeamID: "T", Environment: tc.clientEnv, BaseURL: tc.baseURL})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.target(&Notification{DeviceToken: tok, Topic: "t", Payload: []byte("{}"), Environment: tc.deviceEnv})
		if err != nil || got != tc.want {
			t.Errorf("client %q base %q device %q: %q %v, want %q", tc.clientEnv, tc.baseURL, tc.deviceEnv, got, err, tc.want)
		}
		c.Close()
	}
	c, _ := New(Config{KeyFile: key, KeyID: "K", TeamID: "T"})
	if _, err := c.target(&Notification{DeviceToken: tok, Topic: "t", Payload: []byte("{}"), Environment: "staging"}); err == nil || !strings.Contains(err.Error(), "staging") {
		t.Errorf("unknown device environment: %v", err)
	}
}
