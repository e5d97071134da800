package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"edgerelay/fastpath/cors"
)

// Config is the typed view of the settings that the server is wired from.
// Every field comes from one setting (named in its comment) except the
// listeners' TLS files, which are resolved from the shared and the
// per-service settings. A zero Listener, including a missing map entry,
// is a service that is off.
type Config struct {
	DataDir      string        // RELAY_DATA_DIR
	LogLevel     slog.Level    // RELAY_LOG_LEVEL
	DrainTimeout time.Duration // RELAY_DRAIN_TIMEOUT
	DiskReserve  int           // RELAY_DISK_RESERVE, bytes; 0: no guard
	AdminListen  string        // RELAY_ADMIN_LISTEN; "" = off; never TLS
	CORS         cors.Origins  // RELAY_CORS_ORIGINS; zero = no CORS headers

	// Listeners has an entry for every service in Services().
	Listeners map[Service]Listener

	// ACME is where the listeners whose Listener.ACME is set get their
	// certificates.
	ACME ACMEConfig

	Limits     Limits
	Mailbox    MailboxConfig
	TURN       TURNConfig
	APNs       APNsConfig
	FCM        FCMConfig
	Gateway    GatewayConfig
	Cloudflare CloudflareConfig
	Agent      AgentConfig
	Cluster    ClusterConfig
	Demo       DemoConfig
}

// DemoConfig is the first-run demo (make run). Off in production.
type DemoConfig struct {
	On     bool   // RELAY_DEMO
	Listen string // RELAY_DEMO_LISTEN: the example app's origin
	Dir    string // RELAY_DEMO_DIR: the SDK's directory, served as that origin's root
}

// ClusterConfig says whether and how the node shares its state with other
// nodes. Zero is a single node.
type ClusterConfig struct {
	NodeName           string   // RELAY_NODE_NAME, the host name when unset
	URLs               []string // RELAY_NATS_URL
	CredsFile          string   // RELAY_NATS_CREDS
	TLSCA              string   // RELAY_NATS_TLS_CA
	EmbedListen        string   // RELAY_NATS_EMBED_LISTEN
	EmbedClusterListen string   // RELAY_NATS_EMBED_CLUSTER_LISTEN
	EmbedRoutes        []string // RELAY_NATS_EMBED_ROUTES
	Replicas           int      // RELAY_NATS_REPLICAS
}

// On reports whether the node runs in cluster mode.
func (c ClusterConfig) On() bool { return len(c.URLs) > 0 || c.EmbedListen != "" }

// Listener is where one service listens and with which certificate.
type Listener struct {
	Addr string // RELAY_<SERVICE>_LISTEN: host:port, "" = service off

	// CertFile and KeyFile are both set (TLS) or both empty (plain; for the
	// agent, which is always TLS, the development certificate). They come
	// from RELAY_<SERVICE>_TLS_CERT/_KEY if either of those is set, even to
	// empty, else from RELAY_TLS_CERT/_KEY.
	CertFile, KeyFile string

	// ACME is set when the listener serves certificates from the ACME CA
	// (Config.ACME): RELAY_ACME_DOMAINS is set and neither
	// RELAY_<SERVICE>_TLS_CERT nor _KEY is (set empty, they keep the
	// listener out). It excludes CertFile: Config refuses both.
	ACME bool
}

// On reports whether the service runs at all.
func (l Listener) On() bool { return l.Addr != "" }

// TLS reports whether a certificate file was configured for this listener.
func (l Listener) TLS() bool { return l.CertFile != "" }

// ACMEConfig is the ACME CA that certificates are obtained from. Zero is
// off.
type ACMEConfig struct {
	Domains    []string // RELAY_ACME_DOMAINS, lower case, each checked
	Email      string   // RELAY_ACME_EMAIL; "" = no contact
	Directory  string   // RELAY_ACME_DIRECTORY
	HTTPListen string   // RELAY_ACME_HTTP_LISTEN; "" = no HTTP-01
	CAFile     string   // RELAY_ACME_CA; "" = the system roots alone
}

// On reports whether certificates come from an ACME CA.
func (a ACMEConfig) On() bool { return len(a.Domains) > 0 }

// Limits apply to every listener separately.
type Limits struct {
	MaxConns       int           // RELAY_MAX_CONNS: concurrent connections in total
	MaxConnsPerIP  int           // RELAY_MAX_CONNS_PER_IP
	AcceptRate     int           // RELAY_ACCEPT_RATE: new connections per second
	AcceptBurst    int           // RELAY_ACCEPT_BURST
	HeaderTimeout  time.Duration // RELAY_HEADER_TIMEOUT
	IdleTimeout    time.Duration // RELAY_IDLE_TIMEOUT: keep-alive idle, plain HTTP
	MaxHeaderBytes int           // RELAY_MAX_HEADER_BYTES
	ParkSockets    bool          // RELAY_WS_PARK: idle WebSockets off their goroutines
}

// MailboxConfig is the configuration that shapes the mailbox protocol.
type MailboxConfig struct {
	Apps           string        // RELAY_APPS, unparsed: the mailbox package owns its syntax
	Idle           time.Duration // RELAY_IDLE: idle expiry
	MaxEnvelope    int           // RELAY_MAX_ENVELOPE, bytes
	MaxStored      int           // RELAY_MAX_STORED, envelopes per direction
	MaxStoredBytes int           // RELAY_MAX_STORED_BYTES, per direction
	EnvelopeCache  int           // RELAY_ENVELOPE_CACHE, bytes; 0: none
}

// AgentConfig is the configuration that shapes the agent relay.
type AgentConfig struct {
	InstanceQueue int // RELAY_AGENT_INSTANCE_QUEUE_BYTES: queued for one instance's clients together
}

// TURNConfig configures the TURN server and the credentials the mailbox
// ice endpoint mints for it.
type TURNConfig struct {
	Secret     Secret         // RELAY_TURN_SECRET; "" = no REST credentials
	Realm      string         // RELAY_TURN_REALM
	RelayIP    netip.Addr     // RELAY_TURN_RELAY_IP; invalid (zero) = unset
	AllowPeers []netip.Prefix // RELAY_TURN_ALLOW_PEERS
	// SocketBuffer is RELAY_TURN_SOCKET_BUFFER: bytes of receive and send
	// buffer per UDP socket (listener and each relay socket).
	SocketBuffer int
}

// APNsConfig holds the APNs provider credentials, shared by mailbox push and
// the push gateway. Checking that they are complete is the provider's job:
// an incomplete provider is "unconfigured", not a reason to refuse to start.
type APNsConfig struct {
	KeyFile     string // RELAY_APNS_KEY_FILE (.p8)
	KeyID       string // RELAY_APNS_KEY_ID
	TeamID      string // RELAY_APNS_TEAM_ID
	Topic       string // RELAY_APNS_TOPIC (push gateway)
	Environment string // RELAY_APNS_ENVIRONMENT, as given: the provider judges it
	URL         string // RELAY_APNS_URL; "" = Apple's
}

// FCMConfig holds the FCM provider credentials.
type FCMConfig struct {
	Credentials string // RELAY_FCM_CREDENTIALS: service-account JSON file
	URL         string // RELAY_FCM_URL; "" = Google's
}

// GatewayConfig holds the push gateway's own settings.
type GatewayConfig struct {
	Registration       bool   // RELAY_PUSH_REGISTRATION: POST /register open
	RatePerMinute      int    // RELAY_PUSH_RATE_PER_MINUTE, per API key
	DailyBudget        int    // RELAY_PUSH_DAILY_BUDGET, meaningful only if Metered
	Metered            bool   // false: RELAY_PUSH_DAILY_BUDGET unset, no daily limit
	TrustedProxyHeader string // RELAY_TRUSTED_PROXY_HEADER; "" = the connection's address
	SeparateKeys       bool   // RELAY_PUSH_SEPARATE_KEYS: one key store per mount
}

// CloudflareConfig holds the Cloudflare Realtime TURN key the mailbox ice
// endpoint uses.
type CloudflareConfig struct {
	KeyID    string // RELAY_CF_TURN_KEY_ID
	APIToken Secret // RELAY_CF_TURN_API_TOKEN
	URL      string // RELAY_CF_URL; "" = Cloudflare's
}

// Secret is a string that does not print. fmt (every verb, %#v included),
// log/slog and encoding/json all show "[redacted]" when it is set, so a
// Config can be logged or dumped whole without leaking a credential. Code
// that needs the value calls Reveal, which is easy to find in review.
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret itself.
func (s Secret) Reveal() string { return string(s) }

func (s Secret) shown() string {
	if s == "" {
		return ""
	}
	return redacted
}

// String returns "[redacted]", or "" when the secret is empty.
func (s Secret) String() string { return s.shown() }

// Format makes every fmt verb print String().
func (s Secret) Format(f fmt.State, _ rune) { io.WriteString(f, s.shown()) }

// LogValue keeps the secret out of log/slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.shown()) }

// MarshalText keeps the secret out of encoding/json and other encoders.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.shown()), nil }

// Config builds the typed view and checks what no single value can show
// wrong on its own: a certificate without its key, an empty data directory,
// a TURN server without a realm. It reports every such problem at once.
func (v *Values) Config() (Config, error) {
	var errs []error
	c := Config{
		DataDir:      v.String(EnvDataDir),
		DrainTimeout: v.Duration(EnvDrainTimeout),
		AdminListen:  v.String(EnvAdminListen),
		Listeners:    make(map[Service]Listener, len(Services())),
		Limits: Limits{
			MaxConns:       v.Int(EnvMaxConns),
			MaxConnsPerIP:  v.Int(EnvMaxConnsPerIP),
			AcceptRate:     v.Int(EnvAcceptRate),
			AcceptBurst:    v.Int(EnvAcceptBurst),
			HeaderTimeout:  v.Duration(EnvHeaderTimeout),
			IdleTimeout:    v.Duration(EnvIdleTimeout),
			MaxHeaderBytes: v.Int(EnvMaxHeaderBytes),
			ParkSockets:    v.Bool(EnvWSPark),
		},
		Mailbox: MailboxConfig{
			Apps:           v.String(EnvApps),
			Idle:           v.Duration(EnvIdle),
			MaxEnvelope:    v.Int(EnvMaxEnvelope),
			MaxStored:      v.Int(EnvMaxStored),
			MaxStoredBytes: v.Int(EnvMaxStoredBytes),
		},
		TURN: TURNConfig{
			Secret: Secret(v.String(EnvTURNSecret)),
			Realm:  v.String(EnvTURNRealm),
			// The default is turn.DefaultSocketBuffer (one megabyte).
			SocketBuffer: v.Int(EnvTURNSocketBuffer),
		},
		APNs: APNsConfig{
			KeyFile:     v.String(EnvAPNsKeyFile),
			KeyID:       v.String(EnvAPNsKeyID),
			TeamID:      v.String(EnvAPNsTeamID),
			Topic:       v.String(EnvAPNsTopic),
			Environment: v.String(EnvAPNsEnvironment),
			URL:         v.String(EnvAPNsURL),
		},
		FCM: FCMConfig{
			Credentials: v.String(EnvFCMCredentials),
			URL:         v.String(EnvFCMURL),
		},
		Gateway: GatewayConfig{
			Registration:       v.Bool(EnvPushRegistration),
			RatePerMinute:      v.Int(EnvPushRatePerMinute),
			TrustedProxyHeader: v.String(EnvTrustedProxyHeader),
			SeparateKeys:       v.Bool(EnvPushSeparateKeys),
		},
		Cloudflare: CloudflareConfig{
			KeyID:    v.String(EnvCFTURNKeyID),
			APIToken: Secret(v.String(EnvCFTURNAPIToken)),
			URL:      v.String(EnvCFURL),
		},
		Agent: AgentConfig{InstanceQueue: v.Int(EnvAgentInstanceQueueBytes)},
		Demo:  DemoConfig{On: v.Bool(EnvDemo), Listen: v.String(EnvDemoListen), Dir: v.String(EnvDemoDir)},
		Cluster: ClusterConfig{
			NodeName:           v.String(EnvNodeName),
			URLs:               splitList(v.String(EnvNATSURL)),
			CredsFile:          v.String(EnvNATSCreds),
			TLSCA:              v.String(EnvNATSTLSCA),
			EmbedListen:        v.String(EnvNATSEmbedListen),
			EmbedClusterListen: v.String(EnvNATSEmbedClusterListen),
			EmbedRoutes:        splitList(v.String(EnvNATSEmbedRoutes)),
			Replicas:           v.Int(EnvNATSReplicas),
		},
	}
	// Load checked every value, so these parses cannot fail.
	_ = c.LogLevel.UnmarshalText([]byte(v.String(EnvLogLevel)))
	if ip := v.String(EnvTURNRelayIP); ip != "" {
		c.TURN.RelayIP, _ = netip.ParseAddr(ip)
	}
	c.TURN.AllowPeers, _ = parseCIDRs(v.String(EnvTURNAllowPeers))
	c.Gateway.DailyBudget, c.Gateway.Metered = v.OptionalInt(EnvPushDailyBudget)
	c.Mailbox.EnvelopeCache, _ = v.OptionalInt(EnvEnvelopeCache) // empty: none, like 0
	c.DiskReserve, _ = v.OptionalInt(EnvDiskReserve)             // empty: no guard, like 0

	if c.DataDir == "" {
		errs = append(errs, fmt.Errorf("%s is empty: the server needs a data directory", EnvDataDir))
	}
	var err error
	if c.CORS, err = cors.ParseOrigins(v.String(EnvCORSOrigins)); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvCORSOrigins, err))
	}

	pair := func(certEnv, keyEnv string) (cert, key string) {
		cert, key = v.String(certEnv), v.String(keyEnv)
		if (cert == "") != (key == "") {
			errs = append(errs, fmt.Errorf("%s and %s go together: set both or neither", certEnv, keyEnv))
		}
		return cert, key
	}
	sharedCert, sharedKey := pair(EnvTLSCert, EnvTLSKey)
	c.ACME, errs = v.acme(errs)
	var sharedWithACME []string // listeners given both RELAY_TLS_CERT and ACME
	conflict := false           // a listener given a file and ACME
	for _, s := range Services() {
		l := Listener{Addr: v.String(s.ListenEnv()), CertFile: sharedCert, KeyFile: sharedKey}
		own := v.IsSet(s.TLSCertEnv()) || v.IsSet(s.TLSKeyEnv())
		if own {
			l.CertFile, l.KeyFile = pair(s.TLSCertEnv(), s.TLSKeyEnv())
		}
		// ACME stands in for RELAY_TLS_CERT: a listener's own setting,
		// empty, keeps it out; a certificate file for it as well is a
		// mistake that start-up must not guess about.
		l.ACME = c.ACME.On() && !own
		switch {
		case c.ACME.On() && own && l.CertFile != "":
			errs = append(errs, fmt.Errorf("%s and %s both give the %s listener its certificate: set one of them (%s= empty keeps the listener out of ACME)", EnvACMEDomains, s.TLSCertEnv(), s, s.TLSCertEnv()))
			conflict = true
		case l.ACME && l.CertFile != "":
			sharedWithACME = append(sharedWithACME, string(s))
			l.ACME, conflict = false, true
		}
		c.Listeners[s] = l
	}
	if c.ACME.On() && !conflict && !slices.ContainsFunc(Services(), func(s Service) bool { return c.Listeners[s].On() && c.Listeners[s].ACME }) {
		errs = append(errs, fmt.Errorf("%s is set but no listener takes its certificates: every one is off or has its RELAY_<SERVICE>_TLS_CERT set", EnvACMEDomains))
	}
	if len(sharedWithACME) > 0 {
		errs = append(errs, fmt.Errorf("%s and %s both give the %s listeners their certificate: set one of them", EnvACMEDomains, EnvTLSCert, strings.Join(sharedWithACME, ", ")))
	}

	if c.Listeners[TURN].On() && c.TURN.Realm == "" {
		errs = append(errs, fmt.Errorf("%s is empty while TURN is on (%s=%s)", EnvTURNRealm, TURN.ListenEnv(), c.Listeners[TURN].Addr))
	}

	errs = append(errs, c.Cluster.check()...)

	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// acme reads the ACME settings; problems are added to errs.
func (v *Values) acme(errs []error) (ACMEConfig, []error) {
	a := ACMEConfig{
		Email:      v.String(EnvACMEEmail),
		Directory:  v.String(EnvACMEDirectory),
		HTTPListen: v.String(EnvACMEHTTPListen),
		CAFile:     v.String(EnvACMECA),
	}
	for _, d := range splitList(v.String(EnvACMEDomains)) {
		d = strings.ToLower(d)
		if err := checkACMEDomain(d); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q %w", EnvACMEDomains, d, err))
			continue
		}
		if !slices.Contains(a.Domains, d) {
			a.Domains = append(a.Domains, d)
		}
	}
	if !a.On() && !v.IsSet(EnvACMEDomains) {
		var orphans []string
		for _, env := range []string{EnvACMEEmail, EnvACMEDirectory, EnvACMEHTTPListen, EnvACMECA} {
			if v.IsSet(env) && v.String(env) != "" {
				orphans = append(orphans, env)
			}
		}
		if len(orphans) > 0 {
			errs = append(errs, fmt.Errorf("%s apply to %s, which is not set", strings.Join(orphans, ", "), EnvACMEDomains))
		}
	}
	if a.Directory == "" && a.On() {
		errs = append(errs, fmt.Errorf("%s is empty while %s is set", EnvACMEDirectory, EnvACMEDomains))
	}
	return a, errs
}

// checkACMEDomain says why d cannot be one of RELAY_ACME_DOMAINS: the CA
// validates a name by connecting to it, so it must be a DNS name with at
// least two labels (autocert refuses a bare "localhost"), and neither an
// IP address (clients send no server name for one) nor a wildcard (which
// needs DNS-01, which the relay cannot answer).
func checkACMEDomain(d string) error {
	switch {
	case strings.Contains(d, "*"):
		return errors.New("is a wildcard: the relay answers TLS-ALPN-01 and HTTP-01, and a wildcard needs DNS-01; list the names")
	case strings.Contains(d, ":") || net.ParseIP(d) != nil:
		return errors.New("is not a host name (no port, no IP address)")
	case !strings.Contains(strings.Trim(d, "."), "."):
		return errors.New("has one label: the CA can validate only a name such as relay.example.com")
	case len(d) > 253:
		return errors.New("is longer than 253 characters")
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("is not a DNS name")
		}
		for _, ch := range label {
			if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-') {
				return errors.New("is not a DNS name (letters, digits and hyphens; IDNs in their xn-- form)")
			}
		}
	}
	return nil
}

// check reports the cluster settings that cannot work together, and fills
// in the node name.
func (c *ClusterConfig) check() (errs []error) {
	embedOnly := c.EmbedClusterListen != "" || len(c.EmbedRoutes) > 0
	switch {
	case len(c.URLs) > 0 && (c.EmbedListen != "" || embedOnly):
		errs = append(errs, fmt.Errorf("%s and the %s settings exclude each other: connect to an external NATS cluster or embed one", EnvNATSURL, "RELAY_NATS_EMBED_*"))
	case c.EmbedListen != "" && (c.EmbedClusterListen == "" || len(c.EmbedRoutes) == 0):
		errs = append(errs, fmt.Errorf("%s needs %s and %s: an embedded server joins the others through its routes", EnvNATSEmbedListen, EnvNATSEmbedClusterListen, EnvNATSEmbedRoutes))
	case c.EmbedListen == "" && embedOnly:
		errs = append(errs, fmt.Errorf("%s and %s need %s", EnvNATSEmbedClusterListen, EnvNATSEmbedRoutes, EnvNATSEmbedListen))
	}
	if len(c.URLs) == 0 && (c.CredsFile != "" || c.TLSCA != "") {
		errs = append(errs, fmt.Errorf("%s and %s apply to %s, which is empty", EnvNATSCreds, EnvNATSTLSCA, EnvNATSURL))
	}
	if c.On() && c.NodeName == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			errs = append(errs, fmt.Errorf("%s is empty and the host name is unknown (%v): name this node", EnvNodeName, err))
		}
		c.NodeName = host
	}
	return errs
}

// splitList splits a comma-separated setting, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
