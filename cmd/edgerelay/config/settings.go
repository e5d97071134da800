package config

import (
	"fmt"
	"strings"
)

// Kind says what shape a setting's value has. Every value is checked against
// its kind when it is read, whichever layer it comes from, so that a typo in
// a config file is reported even when the environment overrides it.
type Kind int

const (
	// KindString is any text, empty included.
	KindString Kind = iota
	// KindInt is a positive decimal integer. Zero is refused: every count
	// here is a limit, and a limit of zero would quietly refuse everything.
	KindInt
	// KindOptionalInt is empty ("unset") or a decimal integer >= 0, for
	// settings where unset and zero mean different things
	// (RELAY_PUSH_DAILY_BUDGET: unset is unmetered, 0 closes the gateway).
	KindOptionalInt
	// KindBool is anything strconv.ParseBool accepts: true, false, 1, 0, …
	KindBool
	// KindDuration is a positive Go duration: "10s", "1m30s", "720h".
	KindDuration
	// KindAddr is a listen address host:port (host may be empty for every
	// interface, port 0 picks a free port), or empty: the service is off.
	KindAddr
	// KindIP is empty or one IPv4 or IPv6 address.
	KindIP
	// KindCIDRs is empty or a comma-separated list of CIDR prefixes; a bare
	// address stands for itself (/32 or /128).
	KindCIDRs
	// KindURL is empty or an absolute http or https URL.
	KindURL
	// KindLevel is a log/slog level: debug, info, warn or error.
	KindLevel
)

// String returns the placeholder that help texts show for a value of this
// kind, as in "--max-conns int".
func (k Kind) String() string {
	switch k {
	case KindString:
		return "string"
	case KindInt:
		return "int"
	case KindOptionalInt:
		return "int"
	case KindBool:
		return "bool"
	case KindDuration:
		return "duration"
	case KindAddr:
		return "host:port"
	case KindIP:
		return "ip"
	case KindCIDRs:
		return "cidrs"
	case KindURL:
		return "url"
	case KindLevel:
		return "level"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Group sorts settings into the sections of `edgerelay serve --help` and of
// the README table. The order of the constants below is the order of the
// sections.
type Group string

const (
	GroupGeneral   Group = "general"
	GroupListeners Group = "listeners"
	GroupTLS       Group = "tls"
	GroupACME      Group = "acme"
	GroupTURN      Group = "turn"
	GroupMailbox   Group = "mailbox"
	GroupPush      Group = "push"
	GroupICE       Group = "ice"
	GroupAgent     Group = "agent"
	GroupLimits    Group = "limits"
	GroupCluster   Group = "cluster"
	GroupDemo      Group = "demo"
)

// Groups returns every group in section order.
func Groups() []Group {
	return []Group{GroupGeneral, GroupListeners, GroupTLS, GroupACME, GroupTURN, GroupMailbox, GroupPush, GroupICE, GroupAgent, GroupLimits, GroupCluster, GroupDemo}
}

// title is the heading of a group's section in Usage and the README.
func (g Group) title() string {
	switch g {
	case GroupGeneral:
		return "General"
	case GroupListeners:
		return "Listen addresses (empty turns a service off)"
	case GroupTLS:
		return "TLS (the admin listener is always plain HTTP)"
	case GroupACME:
		return "Automatic certificates from an ACME CA such as Let's Encrypt (docs/acme.md)"
	case GroupTURN:
		return "TURN"
	case GroupMailbox:
		return "Mailbox"
	case GroupPush:
		return "Push providers (shared by mailbox push and the push gateway) and push gateway"
	case GroupICE:
		return "ICE servers from Cloudflare Realtime"
	case GroupAgent:
		return "Agent relay"
	case GroupLimits:
		return "Limits (applied to every listener)"
	case GroupCluster:
		return "Cluster mode (shared state in NATS JetStream; unset: a single node on Pebble)"
	case GroupDemo:
		return "First-run demo (make run; production leaves it off)"
	}
	return string(g)
}

// Setting is one row of the table: everything the program knows about a
// setting apart from its value.
type Setting struct {
	Env     string // environment and config-file name: RELAY_MAILBOX_LISTEN
	Flag    string // flag name without dashes: mailbox-listen
	Default string // value when no layer sets it, in the same syntax as a given value
	Help    string // one sentence or two, shown by --help and the README
	Kind    Kind
	Group   Group
	Secret  bool // never printed: no default, no value, not in errors
}

// flagName derives a flag name from an environment name:
// RELAY_PUSH_FCM_LISTEN becomes push-fcm-listen.
func flagName(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "RELAY_")), "_", "-")
}

// All returns every setting, grouped in the order of [Groups] and, within a
// group, in the order an operator reads them. The slice is new on every call;
// changing it changes nothing else.
func All() []Setting {
	s := table()
	for i := range s {
		s[i].Flag = flagName(s[i].Env)
	}
	return s
}

// table is the one place that defines the settings. Flag names are filled in
// by All, so that they cannot disagree with the environment names.
func table() []Setting {
	var t []Setting
	add := func(g Group, env string, k Kind, def, help string) {
		t = append(t, Setting{Env: env, Default: def, Help: help, Kind: k, Group: g})
	}
	secret := func(g Group, env, help string) {
		t = append(t, Setting{Env: env, Help: help, Kind: KindString, Group: g, Secret: true})
	}

	add(GroupGeneral, EnvConfig, KindString, "",
		"Config file read before the environment: lines of RELAY_NAME=value (or flag-name = value), # comments, blank lines. The environment and flags override it.")
	add(GroupGeneral, EnvDataDir, KindString, "./data",
		"Data directory: the Pebble store, the development TLS certificate (its CA in tls/ca.pem), the ACME cache (acme/) and the agent-relay signing key. Key-management commands find it the same way.")
	add(GroupGeneral, EnvLogLevel, KindLevel, "info",
		"Least severe level logged (debug, info, warn, error). Logs are JSON lines and never contain a token, key, device token or envelope byte.")
	add(GroupGeneral, EnvDrainTimeout, KindDuration, "10s",
		"On SIGTERM: stop accepting, close WebSockets with 1001, finish in-flight writes and close the store, within this time; then exit.")
	add(GroupGeneral, EnvDiskReserve, KindOptionalInt, "268435456",
		"Free bytes kept in the data dir's filesystem (256 MiB): while less is free every write is refused (503, storage_unavailable) and /readyz is 503; reads go on. Half of it is held in <data dir>/ballast and released when the disk fills anyway. 0 or empty: no guard, no ballast.")

	add(GroupGeneral, EnvCORSOrigins, KindString, "",
		"Origins whose web pages may call the mailbox and agent HTTP endpoints (CORS): comma-separated scheme://host[:port], or * for any; empty: no CORS headers. A preflight is answered before authorization; the bearer still decides every request (docs/cors.md).")

	add(GroupListeners, EnvAdminListen, KindAddr, "127.0.0.1:9090",
		"Admin listener: /metrics, /healthz, /readyz and the key-management endpoints the command line uses. Plain HTTP: keep it on loopback. Empty: off.")
	for _, s := range Services() {
		add(GroupListeners, s.envPrefix()+"_LISTEN", KindAddr, s.defaultListen(),
			s.description()+". Empty: off.")
	}

	add(GroupTLS, EnvTLSCert, KindString, "",
		"PEM certificate (chain) file that turns TLS on for every listener but admin; needs RELAY_TLS_KEY. A service's own RELAY_<SERVICE>_TLS_CERT overrides it.")
	add(GroupTLS, EnvTLSKey, KindString, "",
		"PEM private-key file for RELAY_TLS_CERT.")
	for _, s := range Services() {
		plain := "Set empty to keep this listener plain despite RELAY_TLS_CERT or RELAY_ACME_DOMAINS."
		if s == Agent {
			plain = "The agent listener is always TLS: without a certificate file it uses ACME's (RELAY_ACME_DOMAINS), else a development one whose CA is <data dir>/tls/ca.pem; set empty to keep the development one despite RELAY_ACME_DOMAINS."
		}
		add(GroupTLS, s.envPrefix()+"_TLS_CERT", KindString, "",
			fmt.Sprintf("PEM certificate file for the %s listener alone, instead of RELAY_TLS_CERT; needs %s_TLS_KEY. %s", s, s.envPrefix(), plain))
		add(GroupTLS, s.envPrefix()+"_TLS_KEY", KindString, "",
			fmt.Sprintf("PEM private-key file for %s_TLS_CERT.", s.envPrefix()))
	}

	add(GroupACME, EnvACMEDomains, KindString, "",
		"Comma-separated host names to get certificates for from an ACME CA, renewed before expiry without a restart: set, every listener but admin serves TLS with them in place of RELAY_TLS_CERT, the agent listener in place of its development certificate, TURN with turns: beside it. A listener whose RELAY_<SERVICE>_TLS_CERT is set empty stays out (plain; the agent on its development certificate); one with a certificate file as well is refused. Cached in <data dir>/acme.")
	add(GroupACME, EnvACMEEmail, KindString, "",
		"Contact address of the ACME account (the CA's expiry and policy notices); empty: none.")
	add(GroupACME, EnvACMEDirectory, KindURL, DefaultACMEDirectory,
		"Directory URL of the ACME CA; Let's Encrypt's staging CA is https://acme-staging-v02.api.letsencrypt.org/directory. Each directory has its own account and certificates in the cache.")
	add(GroupACME, EnvACMEHTTPListen, KindAddr, "",
		"Plain-HTTP listener answering HTTP-01 challenges (the CA connects to port 80: e.g. :80); other GET and HEAD requests are redirected to https. Empty: TLS-ALPN-01 only, answered by the TLS listeners (the CA connects to port 443: one of them must listen there).")
	add(GroupACME, EnvACMECA, KindString, "",
		"PEM file of roots trusted for the ACME directory's HTTPS besides the system's, for a private ACME CA (tests use pebble's).")

	secret(GroupTURN, EnvTURNSecret,
		"Shared secret of the coturn REST credential scheme: TURN checks credentials with it and the mailbox ice endpoint mints them with it.")
	add(GroupTURN, EnvTURNRealm, KindString, "edgerelay",
		"TURN realm.")
	add(GroupTURN, EnvTURNRelayIP, KindIP, "",
		"Public IP address TURN advertises for relayed addresses; set it when the listen address is not the address clients reach.")
	add(GroupTURN, EnvTURNAllowPeers, KindCIDRs, "",
		"Comma-separated CIDRs that relayed traffic may reach despite the default deny of every address that is not globally reachable, e.g. 10.1.0.0/16,192.168.5.7.")
	add(GroupTURN, EnvTURNSocketBuffer, KindInt, "1048576",
		"Receive and send buffer in bytes of the TURN UDP listener and of each allocation's relay socket (1 MiB): too small, bursts of relayed traffic are dropped (edgerelay_turn_socket_drops_total). Memory is taken only for queued datagrams; a relay socket whose reader falls behind may hold about four times this (receive and send, doubled by the kernel). Past net.core.rmem_max/wmem_max only when run as root (CAP_NET_ADMIN), else capped there.")

	add(GroupMailbox, EnvApps, KindString, "",
		`Mailbox apps separated by ";", each name or name:opt,opt with opts push=<APNs topic>, signal, ice; e.g. "notes;chat:push=com.example.chat,signal,ice" (spec/mailbox.md).`)
	add(GroupMailbox, EnvIdle, KindDuration, "720h",
		"Mailbox idle expiry: a mailbox with no claim and no write for this long is erased with everything in it (720h is 30 days).")
	add(GroupMailbox, EnvMaxEnvelope, KindInt, "65536",
		"Largest envelope in bytes; a larger write gets 413.")
	add(GroupMailbox, EnvMaxStored, KindInt, "4096",
		"Most envelopes stored per mailbox direction; a full direction answers 507.")
	add(GroupMailbox, EnvMaxStoredBytes, KindInt, "33554432",
		"Most envelope bytes stored per mailbox direction (32 MiB); a full direction answers 507.")
	add(GroupMailbox, EnvEnvelopeCache, KindOptionalInt, "33554432",
		"Memory in bytes for copies of recently read envelopes (32 MiB), so that reading one again skips the store's read path; 0 keeps none.")

	add(GroupPush, EnvAPNsKeyFile, KindString, "",
		"APNs token-signing key file (.p8).")
	add(GroupPush, EnvAPNsKeyID, KindString, "",
		"Key ID of the .p8 key.")
	add(GroupPush, EnvAPNsTeamID, KindString, "",
		"Apple developer team ID.")
	add(GroupPush, EnvAPNsTopic, KindString, "",
		"APNs topic (bundle id) of push-gateway sends; mailbox apps name theirs in RELAY_APPS.")
	add(GroupPush, EnvAPNsEnvironment, KindString, "production",
		"APNs environment: production or sandbox (case-insensitive); anything else leaves APNs unconfigured rather than guessing.")
	add(GroupPush, EnvAPNsURL, KindURL, "",
		"Base URL override for APNs (tests point it at a fake); empty: Apple's server for RELAY_APNS_ENVIRONMENT.")
	add(GroupPush, EnvFCMCredentials, KindString, "",
		"Path of the Firebase service-account JSON file; its project_id and token_uri are used.")
	add(GroupPush, EnvFCMURL, KindURL, "",
		"Base URL override for the FCM HTTP v1 API (tests point it at a fake).")
	add(GroupPush, EnvPushRegistration, KindBool, "false",
		"true opens the push gateway's POST /register, where anyone may mint an API key (one per address bucket).")
	add(GroupPush, EnvPushRatePerMinute, KindInt, "10",
		"Push-gateway sends per API key per minute.")
	add(GroupPush, EnvPushDailyBudget, KindOptionalInt, "",
		"Push-gateway sends per UTC day, all keys together; unset: unmetered; 0 closes the gateway.")
	add(GroupPush, EnvPushSeparateKeys, KindBool, "false",
		"true gives the FCM and APNs gateway mounts separate key stores (API keys, device-token claims and daily budget each); false shares one between them.")
	add(GroupPush, EnvTrustedProxyHeader, KindString, "",
		"Request header that carries the client address when a trusted reverse proxy is in front (e.g. X-Forwarded-For); empty: the connection's address.")

	add(GroupICE, EnvCFTURNKeyID, KindString, "",
		"Cloudflare Realtime TURN key ID; with RELAY_CF_TURN_API_TOKEN the mailbox ice endpoint hands out Cloudflare TURN credentials.")
	secret(GroupICE, EnvCFTURNAPIToken,
		"API token of that Cloudflare TURN key.")
	add(GroupICE, EnvCFURL, KindURL, "",
		"Base URL override for Cloudflare's TURN credential API (tests point it at a fake).")

	add(GroupAgent, EnvAgentInstanceQueueBytes, KindInt, "67108864",
		"Most bytes queued for all clients of one agent instance together (64 MiB; at least 32 MiB, one client's whole queue). A frame that would pass it closes the client holding the most with 1013 and sends the instance acp.detach.")

	add(GroupLimits, EnvMaxConns, KindInt, "10000",
		"Most concurrent connections per listener; more are closed at accept and counted in /metrics.")
	add(GroupLimits, EnvMaxConnsPerIP, KindInt, "1000",
		"Most concurrent connections from one client IP per listener. Generous for development; in production lower it to what one client address (or NAT) needs.")
	add(GroupLimits, EnvAcceptRate, KindInt, "1000",
		"New connections accepted per second per listener (token-bucket rate); more are closed at accept.")
	add(GroupLimits, EnvAcceptBurst, KindInt, "2000",
		"Most connections accepted in one burst before RELAY_ACCEPT_RATE applies (token-bucket size).")
	add(GroupLimits, EnvHeaderTimeout, KindDuration, "10s",
		"Time a client has to send its request headers. In production 5s is usually enough.")
	add(GroupLimits, EnvIdleTimeout, KindDuration, "120s",
		"How long a keep-alive plain-HTTP connection may sit idle between requests.")
	add(GroupLimits, EnvMaxHeaderBytes, KindInt, "8192",
		"Largest request header block in bytes; a larger request is refused.")
	add(GroupLimits, EnvWSPark, KindBool, "true",
		"Park idle WebSockets (mailbox watch and signal, control sockets, phone channels) off their goroutines in an epoll set until they have something to read, accepted connections until their first byte, and keep-alive connections (plain or TLS) idle for a second between requests until the next one (Linux; elsewhere ignored): an idle socket then costs a few KiB instead of goroutine stacks and buffers (docs/parking.md). false: a goroutine per socket.")

	add(GroupCluster, EnvNodeName, KindString, "",
		"This node's name, unique in the cluster and the same across its restarts (JetStream places replicas by it); empty: the host name.")
	add(GroupCluster, EnvNATSURL, KindString, "",
		"Comma-separated client URLs of an external NATS cluster with JetStream (nats://host:4222,...): set means cluster mode.")
	add(GroupCluster, EnvNATSCreds, KindString, "",
		"NATS credentials file (.creds) for RELAY_NATS_URL.")
	add(GroupCluster, EnvNATSTLSCA, KindString, "",
		"PEM file of the CA that signed the NATS servers' certificates, for tls:// URLs in RELAY_NATS_URL.")
	add(GroupCluster, EnvNATSEmbedListen, KindAddr, "",
		"Client address of a nats-server started inside this process (its JetStream store in <data dir>/nats; the node itself connects in-process): set means cluster mode. Keep it on loopback or a private network.")
	add(GroupCluster, EnvNATSEmbedClusterListen, KindAddr, "",
		"Route address of the embedded nats-server, where the other nodes' servers connect (needed with RELAY_NATS_EMBED_LISTEN).")
	add(GroupCluster, EnvNATSEmbedRoutes, KindString, "",
		"Comma-separated nats-route://host:port of the embedded servers of the cluster (this node's own may be listed too, so every node can get the same list).")
	add(GroupCluster, EnvNATSReplicas, KindInt, "3",
		"Replicas of every stream and bucket: an acknowledged write is fsynced on a majority of them. Must agree on every node.")

	add(GroupDemo, EnvDemo, KindBool, "false",
		"Turns the first-run demo on (make run does): when unset, RELAY_APPS becomes demo:signal,ice (demo:signal with TURN off) and RELAY_TURN_SECRET a secret generated into <data dir>/turn.secret (0600); a loopback TURN listener may relay to loopback peers; the demo origin is added to RELAY_CORS_ORIGINS; the SDK's example app is served on RELAY_DEMO_LISTEN. Refused unless every listener is on loopback.")
	add(GroupDemo, EnvDemoListen, KindAddr, "127.0.0.1:8088",
		"With RELAY_DEMO: where the example app is served (static files of RELAY_DEMO_DIR); must be loopback.")
	add(GroupDemo, EnvDemoDir, KindString, "sdk/js",
		"With RELAY_DEMO: the SDK's directory (built by make js), served as the demo origin's root: /examples/chat/ is the chat example, /dist/ the SDK.")

	return t
}

// ACME settings (docs/acme.md).
const (
	EnvACMEDomains    = "RELAY_ACME_DOMAINS"
	EnvACMEEmail      = "RELAY_ACME_EMAIL"
	EnvACMEDirectory  = "RELAY_ACME_DIRECTORY"
	EnvACMEHTTPListen = "RELAY_ACME_HTTP_LISTEN"
	EnvACMECA         = "RELAY_ACME_CA"
)

// DefaultACMEDirectory is Let's Encrypt's production CA.
const DefaultACMEDirectory = "https://acme-v02.api.letsencrypt.org/directory"

// Cluster-mode settings.
const (
	EnvNodeName               = "RELAY_NODE_NAME"
	EnvNATSURL                = "RELAY_NATS_URL"
	EnvNATSCreds              = "RELAY_NATS_CREDS"
	EnvNATSTLSCA              = "RELAY_NATS_TLS_CA"
	EnvNATSEmbedListen        = "RELAY_NATS_EMBED_LISTEN"
	EnvNATSEmbedClusterListen = "RELAY_NATS_EMBED_CLUSTER_LISTEN"
	EnvNATSEmbedRoutes        = "RELAY_NATS_EMBED_ROUTES"
	EnvNATSReplicas           = "RELAY_NATS_REPLICAS"
)

const (
	EnvDemo       = "RELAY_DEMO"
	EnvDemoListen = "RELAY_DEMO_LISTEN"
	EnvDemoDir    = "RELAY_DEMO_DIR"
)

// Environment names the code refers to. The table above is the authority on
// what exists; these constants only spare callers from typing strings.
const (
	EnvConfig             = "RELAY_CONFIG"
	EnvDataDir            = "RELAY_DATA_DIR"
	EnvLogLevel           = "RELAY_LOG_LEVEL"
	EnvDrainTimeout       = "RELAY_DRAIN_TIMEOUT"
	EnvDiskReserve        = "RELAY_DISK_RESERVE"
	EnvCORSOrigins        = "RELAY_CORS_ORIGINS"
	EnvAdminListen        = "RELAY_ADMIN_LISTEN"
	EnvTLSCert            = "RELAY_TLS_CERT"
	EnvTLSKey             = "RELAY_TLS_KEY"
	EnvTURNSecret         = "RELAY_TURN_SECRET"
	EnvTURNRealm          = "RELAY_TURN_REALM"
	EnvTURNRelayIP        = "RELAY_TURN_RELAY_IP"
	EnvTURNAllowPeers     = "RELAY_TURN_ALLOW_PEERS"
	EnvTURNSocketBuffer   = "RELAY_TURN_SOCKET_BUFFER"
	EnvApps               = "RELAY_APPS"
	EnvIdle               = "RELAY_IDLE"
	EnvMaxEnvelope        = "RELAY_MAX_ENVELOPE"
	EnvMaxStored          = "RELAY_MAX_STORED"
	EnvMaxStoredBytes     = "RELAY_MAX_STORED_BYTES"
	EnvEnvelopeCache      = "RELAY_ENVELOPE_CACHE"
	EnvAPNsKeyFile        = "RELAY_APNS_KEY_FILE"
	EnvAPNsKeyID          = "RELAY_APNS_KEY_ID"
	EnvAPNsTeamID         = "RELAY_APNS_TEAM_ID"
	EnvAPNsTopic          = "RELAY_APNS_TOPIC"
	EnvAPNsEnvironment    = "RELAY_APNS_ENVIRONMENT"
	EnvAPNsURL            = "RELAY_APNS_URL"
	EnvFCMCredentials     = "RELAY_FCM_CREDENTIALS"
	EnvFCMURL             = "RELAY_FCM_URL"
	EnvPushRegistration   = "RELAY_PUSH_REGISTRATION"
	EnvPushRatePerMinute  = "RELAY_PUSH_RATE_PER_MINUTE"
	EnvPushDailyBudget    = "RELAY_PUSH_DAILY_BUDGET"
	EnvPushSeparateKeys   = "RELAY_PUSH_SEPARATE_KEYS"
	EnvTrustedProxyHeader = "RELAY_TRUSTED_PROXY_HEADER"
	EnvCFTURNKeyID        = "RELAY_CF_TURN_KEY_ID"
	EnvCFTURNAPIToken     = "RELAY_CF_TURN_API_TOKEN"
	EnvCFURL              = "RELAY_CF_URL"
	EnvMaxConns           = "RELAY_MAX_CONNS"
	EnvMaxConnsPerIP      = "RELAY_MAX_CONNS_PER_IP"
	EnvAcceptRate         = "RELAY_ACCEPT_RATE"
	EnvAcceptBurst        = "RELAY_ACCEPT_BURST"
	EnvHeaderTimeout      = "RELAY_HEADER_TIMEOUT"
	EnvIdleTimeout        = "RELAY_IDLE_TIMEOUT"
	EnvMaxHeaderBytes     = "RELAY_MAX_HEADER_BYTES"
	EnvWSPark             = "RELAY_WS_PARK"
)

// EnvAgentInstanceQueueBytes bounds what one agent instance's clients hold
// queued together (agent.Config.InstanceQueue).
const EnvAgentInstanceQueueBytes = "RELAY_AGENT_INSTANCE_QUEUE_BYTES"

// Service is a listener that carries one protocol. The admin listener is not
// a Service: it is plain HTTP on loopback and never takes TLS.
type Service string

const (
	Mailbox  Service = "mailbox"
	Channel  Service = "channel"
	PushFCM  Service = "push-fcm"
	PushAPNs Service = "push-apns"
	Agent    Service = "agent"
	TURN     Service = "turn"
)

// Services returns every service in a stable order (that of the listen
// addresses' default ports).
func Services() []Service {
	return []Service{Mailbox, Channel, PushFCM, PushAPNs, Agent, TURN}
}

// envPrefix is the service's part of its setting names: RELAY_PUSH_FCM for
// RELAY_PUSH_FCM_LISTEN and RELAY_PUSH_FCM_TLS_CERT.
func (s Service) envPrefix() string {
	return "RELAY_" + strings.ToUpper(strings.ReplaceAll(string(s), "-", "_"))
}

// ListenEnv, TLSCertEnv and TLSKeyEnv name the service's settings, for
// messages such as "mailbox off (RELAY_MAILBOX_LISTEN is empty)".
func (s Service) ListenEnv() string  { return s.envPrefix() + "_LISTEN" }
func (s Service) TLSCertEnv() string { return s.envPrefix() + "_TLS_CERT" }
func (s Service) TLSKeyEnv() string  { return s.envPrefix() + "_TLS_KEY" }

func (s Service) defaultListen() string {
	switch s {
	case Mailbox:
		return "127.0.0.1:8080"
	case Channel:
		return "127.0.0.1:8081"
	case PushFCM:
		return "127.0.0.1:8082"
	case PushAPNs:
		return "127.0.0.1:8083"
	case Agent:
		return "127.0.0.1:8443"
	case TURN:
		return "127.0.0.1:3478"
	}
	panic("config: unknown service " + string(s))
}

func (s Service) description() string {
	switch s {
	case Mailbox:
		return "Mailbox service: store-and-forward envelopes, watch, push, signal, ice (spec/mailbox.md)"
	case Channel:
		return "Private-channel relay: computers' control sockets and their phones (spec/private-channel.md)"
	case PushFCM:
		return "Push gateway, FCM mount (spec/push-gateway.md)"
	case PushAPNs:
		return "Push gateway, APNs mount (spec/push-gateway.md)"
	case Agent:
		return "Agent relay: agent runtimes and browser clients; always TLS (spec/agent-relay.md)"
	case TURN:
		return "STUN/TURN server, UDP and TCP on the same port"
	}
	panic("config: unknown service " + string(s))
}
