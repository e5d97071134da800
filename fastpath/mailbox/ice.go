package mailbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/turn"
)

// ICEConfig is where the ice endpoint gets TURN credentials from: the
// coturn REST scheme with a shared secret (the built-in TURN server, or
// any coturn), Cloudflare Realtime TURN, or both.
type ICEConfig struct {
	// Secret is RELAY_TURN_SECRET; with URLs it enables REST credentials.
	Secret string
	// URLs are the STUN/TURN URLs of the REST-credential server, e.g.
	// stun:relay.example.com:3478 and turn:relay.example.com:3478?transport=udp.
	URLs []string
	// TTL of the credentials handed out (default 1 h).
	TTL time.Duration
	// Cloudflare Realtime TURN key (both set to use it) and its API base.
	CloudflareKeyID, CloudflareToken string
	CloudflareURL                    string
	// HTTPClient calls Cloudflare (default: 5 s timeout).
	HTTPClient *http.Client
}

// Enabled reports whether any source is configured.
func (c ICEConfig) Enabled() bool {
	return (c.Secret != "" && len(c.URLs) > 0) || (c.CloudflareKeyID != "" && c.CloudflareToken != "")
}

// iceServer is WebRTC's RTCIceServer.
type iceServer struct {
	URLs       []string `json:"urls"`
	Username   string   `json:"username,omitempty"`
	Credential string   `json:"credential,omitempty"`
}

// ice is GET …/ice.
func (h *Handler) ice(ctx *fasthttp.RequestCtx, key uint64, now int64) {
	if !h.take(ctx, h.limits.ice, key, now) {
		return
	}
	cfg := h.cfg.ICE
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = time.Hour
	}
	var servers []iceServer
	haveTURN, failed := false, false
	if cfg.Secret != "" && len(cfg.URLs) > 0 {
		var stun, turnURLs []string
		for _, u := range cfg.URLs {
			if bytes.HasPrefix([]byte(u), []byte("stun")) {
				stun = append(stun, u)
			} else {
				turnURLs = append(turnURLs, u)
			}
		}
		if len(stun) > 0 {
			servers = append(servers, iceServer{URLs: stun})
		}
		if len(turnURLs) > 0 {
			var raw [8]byte
			_, _ = rand.Read(raw[:])
			user, pass := turn.Credentials(cfg.Secret, hex.EncodeToString(raw[:]), ttl, time.Unix(0, now))
			servers = append(servers, iceServer{URLs: turnURLs, Username: user, Credential: pass})
			haveTURN = true
		}
	}
	if cfg.CloudflareKeyID != "" && cfg.CloudflareToken != "" {
		cf, err := h.cloudflare(ttl)
		if err != nil {
			h.log.Warn("cloudflare TURN unavailable", "err", err)
			failed = true
		} else {
			servers = append(servers, cf...)
			for _, s := range cf {
				if s.Username != "" {
					haveTURN = true
				}
			}
		}
	}
	if failed && !haveTURN {
		errUpstreamUnavail.answer(ctx)
		return
	}
	if servers == nil {
		servers = []iceServer{}
	}
	body, _ := json.Marshal(struct {
		ICEServers []iceServer `json:"iceServers"`
		TTL        int64       `json:"ttl"`
	}{servers, int64(ttl / time.Second)})
	ctx.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(body)
}

// cloudflare calls generate-ice-servers and returns its iceServers.
//
// The call's context is its own, bounded by 5 s, and not derived from the
// fasthttp.RequestCtx: that is no standard context, so deriving from it
// started a goroutine that could still read it (its Done fires on server
// shutdown) after fasthttp had reset it for the next request (a data
// race the race detector caught in TestICEFromCloudflare). The request
// never ends before the handler returns anyway, and a drain waits for
// handlers at most RELAY_DRAIN_TIMEOUT.
func (h *Handler) cloudflare(ttl time.Duration) ([]iceServer, error) {
	cfg := h.cfg.ICE
	base := cfg.CloudflareURL
	if base == "" {
		base = "https://rtc.live.cloudflare.com"
	}
	client := cfg.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body := []byte(`{"ttl":` + strconv.FormatInt(int64(ttl/time.Second), 10) + `}`)
	url := base + "/v1/turn/keys/" + cfg.CloudflareKeyID + "/credentials/generate-ice-servers"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("cloudflare request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+cfg.CloudflareToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("cloudflare answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("cloudflare answered %d", resp.StatusCode)
	}
	var out struct {
		ICEServers []iceServer `json:"iceServers"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.ICEServers) == 0 {
		return nil, fmt.Errorf("cloudflare answer is not an iceServers list: %v", err)
	}
	return out.ICEServers, nil
}
